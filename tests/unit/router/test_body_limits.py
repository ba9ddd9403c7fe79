"""An HTTP body's caps, checked on the decoded JSON before any plain type is built: fan-out,
messages, token ids and nesting depth, each a 400 naming its limit."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tandem.router.errors import InvalidRequestError
from tandem.router.http.body_limits import MAX_JSON_DEPTH, check_generation, decode
from tandem.router.http.openai_request import Endpoint
from tandem.router.http.tokenize import detokenize_ids, tokenize_request
from tandem.router.request_caps import RequestCaps

CAPS = RequestCaps(max_fanout=16, max_messages=4, max_token_ids=64)
COMPLETIONS, CHAT = Endpoint.COMPLETIONS, Endpoint.CHAT
USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("endpoint", "body", "param", "why"),
    [
        (COMPLETIONS, {"prompt": "x", "n": 17}, "n", "17 sequences; at most 16"),
        (COMPLETIONS, {"prompt": "x", "n": 2, "best_of": 17}, "n", "17 sequences"),
        (COMPLETIONS, {"prompt": ["a"] * 5, "n": 4}, "prompt",
         "5 prompts x 4 = 20 sequences; at most 16 per request (--max-fanout)"),
        (COMPLETIONS, {"prompt": [[1, 2]] * 17}, "prompt", "17 sequences"),
        (COMPLETIONS, {"prompt": list(range(65))}, "prompt",
         "65 token ids; at most 64 (the context length)"),
        (COMPLETIONS, {"prompt": [[1], list(range(65))]}, "prompt[1]", "65 token ids"),
        (CHAT, {"messages": [USER] * 5}, "messages", "5 messages; at most 4 (--max-messages)"),
        (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 5}]},
         "messages[0].content", "5 content parts; at most 4"),
        (CHAT, {"messages": [USER], "n": 17}, "n", "17 sequences"),
    ],
)
def test_over_a_cap_is_refused_naming_it(endpoint: Endpoint, body: dict[str, Any], param: str,
                                         why: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        check_generation(endpoint, body, CAPS)
    assert err.value.field == param and why in str(err.value)


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        (COMPLETIONS, {"prompt": "x", "n": 16}),
        (COMPLETIONS, {"prompt": ["a"] * 4, "n": 2, "best_of": 4}),
        (COMPLETIONS, {"prompt": list(range(64))}),
        (CHAT, {"messages": [USER] * 4, "n": 16}),
        # shapes parse refuses are left to it (their messages are its)
        (COMPLETIONS, {"prompt": "x", "n": "many"}),
        (CHAT, {"messages": "hi"}),
        (CHAT, [1, 2]),
    ],
)
def test_within_the_caps_passes(endpoint: Endpoint, body: Any) -> None:
    check_generation(endpoint, body, CAPS)


def test_tokenize_and_detokenize_bodies_are_capped() -> None:
    with pytest.raises(InvalidRequestError, match="5 messages") as err:
        tokenize_request({"messages": [USER] * 5}, CAPS)
    assert err.value.field == "messages"
    assert tokenize_request({"messages": [USER] * 4}, CAPS).chat is not None
    with pytest.raises(InvalidRequestError, match="65 token ids") as err:
        detokenize_ids({"tokens": list(range(65))}, 1000, CAPS)
    assert err.value.field == "tokens"
    assert detokenize_ids({"tokens": list(range(64))}, 1000, CAPS) == list(range(64))


def test_json_nested_too_deep_is_a_400_never_a_recursion_error() -> None:
    assert decode(json.dumps({"a": [[1]]})) == {"a": [[1]]}
    within = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert decode(within) is not None
    for text in ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1),
                 '{"a":' * 200 + "1" + "}" * 200,
                 "[" * 100_000 + "]" * 100_000):  # past the decoder's own recursion limit
        with pytest.raises(InvalidRequestError, match=f"deeper than {MAX_JSON_DEPTH}") as err:
            decode(text)
        assert err.value.field == "body"
    with pytest.raises(InvalidRequestError, match="not valid JSON"):
        decode('{"prompt": ')


def test_caps_run_before_the_depth_walk_and_mixed_lists_are_walked() -> None:
    deep = "[" * 200 + "]" * 200
    body = '{"messages": ' + json.dumps([USER] * 5) + ', "extra": ' + deep + "}"
    with pytest.raises(InvalidRequestError, match="5 messages"):  # the cheap check refuses it
        decode(body, lambda value: check_generation(CHAT, value, CAPS))
    with pytest.raises(InvalidRequestError, match="nested deeper"):  # within caps: the walk
        decode('{"messages": [], "extra": ' + deep + "}",
               lambda value: check_generation(CHAT, value, CAPS))
    nested = '{"a": [1, "x", null, ' + deep + "]}"  # a container among plain values
    with pytest.raises(InvalidRequestError, match="nested deeper"):
        decode(nested)
    assert decode('{"a": [1, "x", null, [[2]]]}') == {"a": [1, "x", None, [[2]]]}
