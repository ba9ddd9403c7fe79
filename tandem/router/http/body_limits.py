"""An HTTP body from text to checked JSON: decoded with its nesting bounded, then held to the
request caps (tandem/router/request_caps.py) before tandem/router/http/openai_request.py
builds the router's plain types from it.

    text --json.loads--> value --depth <= MAX_JSON_DEPTH--> caps by endpoint --> parse

Deep nesting is refused as a 400 (never a RecursionError's 500): a JSON value nested deeper
than any OpenAI request needs (tool schemas included) would only cost recursion further on.
Only counts are read here (``len`` of lists and objects), so checking a body costs little
next to decoding it.
"""

from __future__ import annotations

import json
from typing import Any

from tandem.router.errors import InvalidRequestError
from tandem.router.http.openai_request import Endpoint
from tandem.router.request_caps import RequestCaps

MAX_JSON_DEPTH = 128  # nested arrays/objects (serde_json's default recursion limit)


def decode(text: str) -> Any:
    """The JSON value of ``text``; InvalidRequestError when it is not JSON or nests deeper
    than MAX_JSON_DEPTH."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidRequestError("body", f"not valid JSON: {err}") from err
    except RecursionError as err:  # the decoder's own recursion limit, far above ours
        raise _too_deep() from err
    if _depth_over(value, MAX_JSON_DEPTH):
        raise _too_deep()
    return value


def check_generation(endpoint: Endpoint, body: Any, caps: RequestCaps) -> None:
    """A completions or chat body's fan-out, messages and token ids against ``caps``."""
    if not isinstance(body, dict):
        return  # parse says what is wrong with it
    per_prompt = max(_int(body.get("n")), _int(body.get("best_of"))
                     if endpoint is Endpoint.COMPLETIONS else 1)
    prompts = 1
    if endpoint is Endpoint.CHAT:
        check_messages(body.get("messages"), caps)
    else:
        prompts = _check_prompt(body.get("prompt"), caps)
    caps.check_fanout(prompts, per_prompt, "n" if prompts == 1 else "prompt")


def check_messages(messages: Any, caps: RequestCaps) -> None:
    """A chat's message count, and each message's content parts."""
    if not isinstance(messages, list):
        return
    caps.check_messages(len(messages), "messages")
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            caps.check_messages(len(content), f"messages[{i}].content", "content parts")


def _check_prompt(prompt: Any, caps: RequestCaps) -> int:
    """A completions ``prompt``'s token ids; returns how many prompts it holds."""
    if not isinstance(prompt, list) or not prompt:
        return 1
    if not isinstance(prompt[0], (str, list)):  # token ids (parse checks each is one)
        caps.check_token_ids(len(prompt), "prompt")
        return 1
    for i, p in enumerate(prompt):
        if isinstance(p, list):
            caps.check_token_ids(len(p), f"prompt[{i}]")
    return len(prompt)


def _int(value: Any) -> int:
    """A count field as sent, 1 unless a positive integer (parse refuses the others)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def _depth_over(value: Any, limit: int) -> bool:
    """Whether containers in ``value`` nest deeper than ``limit`` (iterative: no recursion)."""
    if not isinstance(value, (dict, list)):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def _too_deep() -> InvalidRequestError:
    return InvalidRequestError("body", f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
