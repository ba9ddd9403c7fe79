"""An HTTP body from text to checked JSON: decoded with its nesting bounded, then held to the
request caps (tandem/router/request_caps.py) before tandem/router/http/openai_request.py
builds the router's plain types from it.

    text --json.loads--> value --caps by endpoint--> --depth <= MAX_JSON_DEPTH--> parse

Deep nesting is refused as a 400 (never a RecursionError's 500): a JSON value nested deeper
than any OpenAI request needs (tool schemas included) would only cost recursion further on.
The caps read counts only (``len`` of lists), so they run first: a body over them is refused
before its values are visited. The depth walk then skips lists of plain values in C (a
million token ids cost it one ``set(map(type, ...))``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tandem.router.errors import InvalidRequestError
from tandem.router.http.openai_request import Endpoint
from tandem.router.request_caps import RequestCaps

MAX_JSON_DEPTH = 128  # nested arrays/objects (serde_json's default recursion limit)


def decode(text: str, caps: Callable[[Any], None] | None = None) -> Any:
    """The JSON value of ``text``, held to ``caps`` (counts only) and then to MAX_JSON_DEPTH;
    InvalidRequestError when it is not JSON or fails either."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidRequestError("body", f"not valid JSON: {err}") from err
    except RecursionError as err:  # the decoder's own recursion limit, far above ours
        raise _too_deep() from err
    if caps is not None:
        caps(value)
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


def check_responses(body: Any, caps: RequestCaps) -> None:
    """A Responses API body's input items (each a message at most) and their content parts;
    its one sequence is within any fan-out cap."""
    items = body.get("input") if isinstance(body, dict) else None
    if not isinstance(items, list):
        return
    caps.check_messages(len(items), "input")
    for i, item in enumerate(items):
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, list):
            caps.check_messages(len(content), f"input[{i}].content", "content parts")


def check_tokenize(body: Any, caps: RequestCaps) -> None:
    """A /tokenize body's messages."""
    if isinstance(body, dict):
        check_messages(body.get("messages"), caps)


def check_detokenize(body: Any, caps: RequestCaps) -> None:
    """A /detokenize body's token ids."""
    tokens = body.get("tokens") if isinstance(body, dict) else None
    if isinstance(tokens, list):
        caps.check_token_ids(len(tokens), "tokens")


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
    """Whether containers in ``value`` nest deeper than ``limit``: level by level, without
    recursion (json.loads builds exactly ``dict`` and ``list``)."""
    level = [value] if type(value) in _CONTAINERS else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        below: list[Any] = []
        for node in level:
            children = node.values() if type(node) is dict else node
            if not _CONTAINERS.isdisjoint(set(map(type, children))):  # in C: no Python loop
                below.extend(c for c in children if type(c) in _CONTAINERS)
        level = below
    return False


_CONTAINERS = frozenset({dict, list})


def _too_deep() -> InvalidRequestError:
    return InvalidRequestError("body", f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
