"""OpenAI request JSON -> the plain GenerateRequest, and the OpenAI error shape at the HTTP
edge."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.router.api.chat import Chat
from tandem.router.api.response import ResponseChunk, TokenLogprob, TopLogprob, Usage
from tandem.router.api.sampling import StructuredOutput
from tandem.router.errors import (
    DeadlineError,
    DrainingError,
    InvalidRequestError,
    NoWorkerError,
    OverloadedError,
    WorkerFailedError,
)
from tandem.router.http.errors import http_error
from tandem.router.http.openai_request import Endpoint, parse
from tandem.router.http.openai_response import ResponseShaper

CHAT = Endpoint.CHAT
COMPLETIONS = Endpoint.COMPLETIONS
USER = [{"role": "user", "content": "hi"}]


def test_completion_maps_sampling_stop_seed_and_logprobs() -> None:
    api = parse(COMPLETIONS, {
        "model": "m", "prompt": "Hello", "max_tokens": 7, "temperature": 0, "top_p": 0.5,
        "seed": 42, "stop": "\n", "logprobs": 3, "presence_penalty": 0.5,
        "frequency_penalty": -1, "stream": True, "stream_options": {"include_usage": True},
        "top_k": 5, "ignore_eos": True, "stop_token_ids": [2], "user": "ignored",
        "speculative": False,
    })
    r = api.request
    assert r.model == "m" and r.prompt == "Hello"
    s = r.sampling
    assert s.max_tokens == 7 and s.temperature is not None and s.temperature == 0.0
    assert s.top_p == 0.5 and s.seed == 42 and list(s.stop) == ["\n"] and s.top_k == 5
    assert s.presence_penalty == 0.5 and s.frequency_penalty == -1.0
    assert s.ignore_eos and list(s.stop_token_ids) == [2]
    assert s.speculative is False
    assert parse(COMPLETIONS, {"prompt": "x"}).request.sampling.speculative is None
    assert r.logprobs.enabled and r.logprobs.top_logprobs == 3
    assert api.stream and api.include_usage


def test_completion_prompt_forms() -> None:
    assert parse(COMPLETIONS, {"prompt": ["one"]}).request.prompt == "one"
    ids = parse(COMPLETIONS, {"prompt": [5, 6, 7]}).request
    assert ids.kind == "token_ids" and ids.prompt == (5, 6, 7)
    assert parse(COMPLETIONS, {"prompt": [[8, 9]]}).request.prompt == (8, 9)
    unset = parse(COMPLETIONS, {"prompt": "x"}).request
    assert unset.sampling.max_tokens is None and not unset.logprobs.enabled
    assert unset.sampling.temperature is None and unset.sampling.seed is None


def test_chat_maps_messages_parts_and_aliases() -> None:
    api = parse(CHAT, {
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"},
                                         {"type": "text", "text": "b"}]},
        ],
        "max_completion_tokens": 9, "max_tokens": 100, "logprobs": True, "top_logprobs": 2,
        "stop": ["x", "y"],
    })
    chat = api.request.prompt
    assert isinstance(chat, Chat)
    assert [(m.role, m.content) for m in chat.messages] == [("system", "be brief"),
                                                            ("user", "ab")]
    assert api.request.sampling.max_tokens == 9  # max_completion_tokens wins
    assert list(api.request.sampling.stop) == ["x", "y"]
    assert api.request.logprobs.enabled and api.request.logprobs.top_logprobs == 2
    assert not api.stream and not api.include_usage
    assert parse(CHAT, {"messages": USER, "max_tokens": 4}).request.sampling.max_tokens == 4


@pytest.mark.parametrize(
    ("endpoint", "body", "param"),
    [
        (COMPLETIONS, [], "body"),
        (COMPLETIONS, {}, "prompt"),
        (COMPLETIONS, {"prompt": ["a", 3]}, "prompt[1]"),
        (COMPLETIONS, {"prompt": ["a"] * 257}, "prompt"),
        (COMPLETIONS, {"prompt": ["a", "b"], "stream": True}, "stream"),
        (COMPLETIONS, {"prompt": [1, -2]}, "prompt"),
        (COMPLETIONS, {"prompt": "x", "n": 0}, "n"),
        (COMPLETIONS, {"prompt": "x", "echo": "yes"}, "echo"),
        (COMPLETIONS, {"prompt": "x", "n": 3, "best_of": 2}, "best_of"),
        (COMPLETIONS, {"prompt": "x", "best_of": 21}, "best_of"),
        (COMPLETIONS, {"prompt": "x", "best_of": 2, "stream": True}, "best_of"),
        (COMPLETIONS, {"prompt": "x", "logit_bias": {"a": 5}}, "logit_bias"),
        (COMPLETIONS, {"prompt": "x", "logit_bias": {"1": "5"}}, "logit_bias"),
        (COMPLETIONS, {"prompt": "x", "logit_bias": [1]}, "logit_bias"),
        (COMPLETIONS, {"prompt": "x", "max_tokens": "5"}, "max_tokens"),
        (COMPLETIONS, {"prompt": "x", "max_tokens": -1}, "max_tokens"),
        (COMPLETIONS, {"prompt": "x", "max_tokens": True}, "max_tokens"),
        (COMPLETIONS, {"prompt": "x", "temperature": "hot"}, "temperature"),
        (COMPLETIONS, {"prompt": "x", "seed": -1}, "seed"),
        (COMPLETIONS, {"prompt": "x", "stop": 3}, "stop"),
        (COMPLETIONS, {"prompt": "x", "stream": "yes"}, "stream"),
        (COMPLETIONS, {"prompt": "x", "speculative": "no"}, "speculative"),
        (COMPLETIONS, {"prompt": "x", "model": 3}, "model"),
        (CHAT, {"messages": []}, "messages"),
        (CHAT, {"messages": ["hi"]}, "messages[0]"),
        (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         "messages[0].content"),
        (CHAT, {"messages": USER, "n": 129}, "n"),
        (CHAT, {"messages": USER, "top_logprobs": 2}, "top_logprobs"),
        (CHAT, {"messages": USER, "tools": [{"type": "function"}]}, "tools[0].function"),
        (CHAT, {"messages": USER, "tool_choice": "required"}, "tool_choice"),
        (CHAT, {"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]},
         "messages[0].tool_calls[0]"),
        (CHAT, {"messages": USER, "response_format": {"type": "xml"}}, "response_format.type"),
        (CHAT, {"messages": USER, "response_format": {"type": "json_schema"}},
         "response_format.json_schema"),
        (CHAT, {"messages": USER, "response_format": {"type": "json_object"},
                "guided_regex": "a+"}, "guided_regex"),
        (CHAT, {"messages": USER, "guided_choice": []}, "guided_choice"),
        (CHAT, {"messages": USER, "structured_outputs": {"regex": 3}}, "structured_outputs.regex"),
        (CHAT, {"messages": USER, "guided_json": "{not json"}, "guided_json"),
        (CHAT, {"messages": USER, "stream": True, "stream_options": {"include_usage": 1}},
         "stream_options.include_usage"),
    ],
)
def test_bad_shapes_name_the_param(endpoint: Endpoint, body: Any, param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        parse(endpoint, body)
    assert err.value.field == param


def test_ranges_are_left_to_the_shared_validator() -> None:
    # Shape is fine, range is not: parse passes it on; tandem/router/validation.py rejects it later.
    api = parse(COMPLETIONS, {"prompt": "x", "temperature": -1, "top_p": 0, "max_tokens": 0})
    assert api.request.sampling.temperature == -1.0 and api.request.sampling.max_tokens == 0


@pytest.mark.parametrize(
    ("err", "status", "kind"),
    [
        (InvalidRequestError("top_p", "bad"), 400, "invalid_request_error"),
        (InvalidRequestError("model", "unknown model 'x'"), 404, "not_found_error"),
        (OverloadedError("full", 1500), 429, "rate_limit_error"),
        (NoWorkerError("none"), 503, "service_unavailable_error"),
        (DrainingError("bye"), 503, "service_unavailable_error"),
        (DeadlineError("late"), 504, "timeout_error"),
        (WorkerFailedError("x", "INVALID_ARGUMENT"), 400, "invalid_request_error"),
        (WorkerFailedError("boom", "INTERNAL"), 503, "service_unavailable_error"),
    ],
)
def test_error_shape_and_status(err: Exception, status: int, kind: str) -> None:
    out = http_error(err)  # type: ignore[arg-type]
    assert out.status == status
    assert set(out.body) == {"error"}
    body = out.body["error"]
    assert set(body) == {"message", "type", "param", "code"}
    assert body["type"] == kind and body["message"] == str(err)
    if isinstance(err, InvalidRequestError):
        assert body["param"] == err.field
    if isinstance(err, OverloadedError):
        assert out.headers == {"Retry-After": "2", "Retry-After-Ms": "1500"}
    else:
        assert out.headers == {}


def _message(**kw: Any) -> ResponseChunk:
    return ResponseChunk("r", **kw)


def test_shaper_whole_and_chunks() -> None:
    lp = (TokenLogprob(token_id=5, logprob=-0.5, top=(TopLogprob(token_id=6, logprob=-1.0),)),)
    text = {5: "ab", 6: "c"}.__getitem__
    messages = [
        _message(token_ids=(5,), text="ab", logprobs=lp),
        _message(token_ids=(5,), text="ab", logprobs=lp, finished=True, finish_reason="length",
                 usage=Usage(prompt_tokens=3, completion_tokens=2, cached_tokens=1)),
    ]
    completion = ResponseShaper(parse(COMPLETIONS, {"prompt": "x"}), "m", "r1", text)
    whole = completion.whole(messages)
    assert whole["id"] == "cmpl-r1" and whole["object"] == "text_completion"
    choice = whole["choices"][0]
    assert choice["text"] == "abab" and choice["finish_reason"] == "length"
    assert choice["logprobs"] == {"tokens": ["ab", "ab"], "token_logprobs": [-0.5, -0.5],
                                  "top_logprobs": [{"c": -1.0}, {"c": -1.0}],
                                  "text_offset": [0, 2]}
    assert whole["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                              "prompt_tokens_details": {"cached_tokens": 1}}
    chat = ResponseShaper(parse(CHAT, {"messages": USER}), "m", "r2", text)
    first, last = chat.chunk(messages[0], True), chat.chunk(messages[1], True)
    assert first["object"] == "chat.completion.chunk" and first["usage"] is None
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "ab"}
    assert first["choices"][0]["finish_reason"] is None
    assert last["choices"][0]["delta"] == {"content": "ab"}
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["choices"][0]["logprobs"]["content"][0] == {
        "token": "ab", "logprob": -0.5, "bytes": [97, 98],
        "top_logprobs": [{"token": "c", "logprob": -1.0, "bytes": [99]}]}
    tail = chat.usage_chunk(messages[1])
    assert tail["choices"] == [] and tail["usage"]["total_tokens"] == 5


@pytest.mark.parametrize(
    ("extra", "kind", "value"),
    [
        ({"response_format": {"type": "json_object"}}, "json_object", True),
        ({"response_format": {"type": "json_schema", "json_schema": {
            "name": "p", "strict": True, "schema": {"type": "object"}}}},
         "json_schema", '{"type":"object"}'),
        ({"guided_json": '{"type": "integer"}'}, "json_schema", '{"type":"integer"}'),
        ({"structured_outputs": {"regex": "[0-9]+"}}, "regex", "[0-9]+"),
        ({"guided_grammar": 'root ::= "a"'}, "grammar", 'root ::= "a"'),
        ({"response_format": {"type": "text"}}, None, None),
    ],
)
def test_structured_outputs_map_onto_one_kind(
    extra: dict[str, Any], kind: str | None, value: object
) -> None:
    so = parse(CHAT, {"messages": USER, **extra}).request.sampling.structured
    assert (None if so is None else so.kind) == kind
    if so is not None:
        assert so.value == value


def test_choice_and_logit_bias_and_user_are_carried() -> None:
    req = parse(COMPLETIONS, {"prompt": "x", "guided_choice": ["yes", "no"],
                              "logit_bias": {"7": -100, "9": 2.5}, "user": "u-1"}).request
    assert req.sampling.structured == StructuredOutput("choice", ("yes", "no"))
    assert dict(req.sampling.logit_bias) == {7: -100.0, 9: 2.5}
    assert req.user == "u-1"


def test_numbers_are_checked_as_the_wire_carries_them() -> None:
    """A JSON number bound for a 32-bit float field is what a gRPC client sending it would
    have: the same value for the checks, and what the workers are sent."""
    from tandem.protos.v1 import tandem_pb2
    from tandem.router.convert.sampling import sampling_from_proto

    values = {"temperature": 1e39, "top_p": 1.00000001, "min_p": -0.1}
    http = parse(COMPLETIONS, {"prompt": "x", **values, "logit_bias": {"5": 0.1}}).request
    grpc_side = sampling_from_proto(tandem_pb2.SamplingParams(**values, logit_bias={5: 0.1}))
    for name in values:
        assert getattr(http.sampling, name) == getattr(grpc_side, name)
    assert http.sampling.logit_bias == grpc_side.logit_bias
    assert http.sampling.temperature == float("inf") and http.sampling.top_p == 1.0
