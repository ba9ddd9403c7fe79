"""The bad-input matrix: every malformed request is INVALID_ARGUMENT naming its field."""

from __future__ import annotations

import asyncio
import math

import grpc
import pytest

from tandem.protos.v1 import tandem_pb2
from tandem.router.api.chat import Chat, ChatMessage
from tandem.router.api.request import GenerateRequest
from tandem.router.api.sampling import LogprobOptions, SamplingSpec, StructuredOutput
from tandem.router.errors import InvalidRequestError
from tandem.router.tokenizer import RouterTokenizer
from tandem.router.validation import (
    InputLimits,
    check_length,
    check_prompt_chars,
    validate_request,
    validate_sampling,
)
from tests.unit.router.harness import MODEL, cluster

VOCAB = 1000
S = SamplingSpec
Msg = ChatMessage


def _text(**sampling: object) -> GenerateRequest:
    return GenerateRequest("hi", sampling=S(**sampling))  # type: ignore[arg-type]


def _chat(*messages: ChatMessage) -> GenerateRequest:
    return GenerateRequest(Chat(messages))


BAD = [
    ("model", GenerateRequest("hi", model="gpt-9")),
    ("prompt", GenerateRequest()),
    ("prompt", GenerateRequest("")),
    ("token_ids", GenerateRequest(())),
    ("token_ids", GenerateRequest((1, VOCAB))),
    ("chat", _chat()),
    ("chat.messages[0].role", _chat(Msg(role="", content="x"))),
    ("chat.messages[1].role", _chat(Msg(role="user", content="x"), Msg(role="robot", content="y"))),
    ("chat.messages[0].content", _chat(Msg(role="user"))),
    ("max_tokens", _text(max_tokens=0)),
    ("min_tokens", _text(max_tokens=4, min_tokens=5)),
    ("min_tokens", _text(min_tokens=17)),  # default max_tokens is 16
    ("temperature", _text(temperature=-0.1)),
    ("temperature", _text(temperature=math.nan)),
    ("temperature", _text(temperature=math.inf)),
    ("top_p", _text(top_p=0.0)),
    ("top_p", _text(top_p=1.5)),
    ("top_k", _text(top_k=-2)),
    ("min_p", _text(min_p=1.1)),
    ("repetition_penalty", _text(repetition_penalty=0.0)),
    ("presence_penalty", _text(presence_penalty=2.5)),
    ("frequency_penalty", _text(frequency_penalty=-3.0)),
    ("seed", _text(seed=2**63)),
    ("stop", _text(stop=("ok", ""))),
    ("stop", _text(stop=("a", "b", "c", "d", "e"))),  # at most 4, as OpenAI's API
    ("stop", _text(stop=("x" * 257,))),
    ("stop_token_ids", _text(stop_token_ids=tuple(range(65)))),
    ("stop_token_ids", _text(stop_token_ids=(VOCAB + 5,))),
    ("logprobs.top_logprobs", GenerateRequest("hi", logprobs=LogprobOptions(top_logprobs=21))),
]


@pytest.mark.parametrize(("field", "request_"), BAD, ids=[f for f, _ in BAD])
def test_bad_request_names_its_field(field: str, request_: GenerateRequest) -> None:
    with pytest.raises(InvalidRequestError) as err:
        validate_request(request_, MODEL, VOCAB)
    assert err.value.field == field


GOOD = [
    GenerateRequest("hi", model=MODEL),
    GenerateRequest((0, VOCAB - 1)),
    _chat(Msg(role="system", content="s"), Msg(role="user", content="u")),
    _text(
        max_tokens=1,
        min_tokens=1,
        temperature=0.0,
        top_p=1.0,
        top_k=-1,
        min_p=0.0,
        repetition_penalty=1.2,
        presence_penalty=-2.0,
        frequency_penalty=2.0,
        seed=2**63 - 1,
        stop=("\n",),
        stop_token_ids=(VOCAB - 1,),
    ),
    _text(stop=("a", "b", "c", "x" * 256), stop_token_ids=tuple(range(64))),  # at the bounds
]


@pytest.mark.parametrize("request_", GOOD)
def test_good_request_passes(request_: GenerateRequest) -> None:
    validate_request(request_, MODEL, VOCAB)


def test_stop_limits_are_configurable_and_say_why() -> None:
    many = _text(stop=tuple(str(i) for i in range(2000)))
    with pytest.raises(InvalidRequestError, match="2000 stop strings; at most 4"):
        validate_request(many, MODEL, VOCAB)
    validate_request(many, MODEL, VOCAB, InputLimits(max_stop_strings=2000))
    long = _text(stop=("y" * 1000,))
    with pytest.raises(InvalidRequestError, match="1000 characters; at most 256"):
        validate_request(long, MODEL, VOCAB)
    validate_request(long, MODEL, VOCAB, InputLimits(max_stop_chars=1000))


def test_prompt_chars_refuse_only_what_cannot_fit() -> None:
    # At most 4 characters per token, a context of 20: a prompt needs at most 19 tokens.
    check_prompt_chars(76, 4, None, 20)  # at least 19 tokens: may fit
    with pytest.raises(InvalidRequestError, match="at least 20 tokens") as err:
        check_prompt_chars(77, 4, None, 20)
    assert err.value.field == "prompt"
    check_prompt_chars(40, 4, 10, 20)  # at least 10 tokens + 10 asked: may fit
    with pytest.raises(InvalidRequestError) as err:
        check_prompt_chars(41, 4, 10, 20)  # at least 11 + 10 asked: cannot
    assert err.value.field == "max_tokens"
    check_prompt_chars(10**9, None, 10, 20)  # no bound known: tokenize and see


def test_length_limits() -> None:
    check_length(10, 10, 20)
    with pytest.raises(InvalidRequestError, match="prompt"):
        check_length(20, 1, 20)
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        check_length(10, 11, 20)


def test_bad_input_over_grpc_then_keeps_serving(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, max_model_len=64) as c:
            bad = [
                tandem_pb2.GenerateRequest(text="hello " * 100),  # oversize prompt
                tandem_pb2.GenerateRequest(
                    text="hi", sampling=tandem_pb2.SamplingParams(max_tokens=100)),
                tandem_pb2.GenerateRequest(model="nope", text="hi"),
                tandem_pb2.GenerateRequest(
                    token_ids=tandem_pb2.TokenIds(ids=[tokenizer.vocab_size])
                ),
                tandem_pb2.GenerateRequest(chat=tandem_pb2.ChatMessages(
                    messages=[tandem_pb2.ChatMessage(role="wizard", content="x")])),
            ]
            for request in bad:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await c.generate(request)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert err.value.details()
            ok = await c.generate(tandem_pb2.GenerateRequest(
                text="hi", sampling=tandem_pb2.SamplingParams(max_tokens=2)))
            assert ok[-1].finished and ok[-1].usage.completion_tokens == 2

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("sampling", "field"),
    [
        (S(logit_bias={70000: 1.0}), "logit_bias"),
        (S(logit_bias={5: 100.5}), "logit_bias"),
        (S(logit_bias={i: 1.0 for i in range(301)}), "logit_bias"),
        (S(structured=StructuredOutput("regex", "a" * 70000)), "structured_outputs.regex"),
        (S(structured=StructuredOutput("choice", ("a", ""))), "structured_outputs.choice"),
        (S(structured=StructuredOutput("json_object", True), ignore_eos=True), "ignore_eos"),
        (S(max_tokens=0), "max_tokens"),
        (S(prompt_logprobs=21), "prompt_logprobs"),
    ],
)
def test_new_sampling_fields_are_bounded(sampling, field) -> None:
    with pytest.raises(InvalidRequestError) as err:
        validate_sampling(sampling, vocab_size=50000)
    assert err.value.field == field


def test_max_tokens_zero_is_valid_only_when_scoring_the_prompt() -> None:
    validate_sampling(S(max_tokens=0, prompt_logprobs=1), 50000)
