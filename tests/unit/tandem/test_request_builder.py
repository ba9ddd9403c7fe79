"""SDK keyword arguments -> the router's proto messages, exactly as tandem.proto defines them."""

from __future__ import annotations

import pytest

from tandem.protos.v1 import tandem_pb2
from tandem.sdk.errors import InvalidRequest
from tandem.sdk.request_builder import (
    SAMPLING_FIELDS,
    generate_request,
    sampling_params,
    tokenize_request,
)


def test_sampling_fields_are_exactly_the_protos() -> None:
    assert SAMPLING_FIELDS == {f.name for f in tandem_pb2.SamplingParams.DESCRIPTOR.fields}


def test_text_prompt_with_sampling() -> None:
    req = generate_request("hello", max_tokens=8, temperature=0, top_k=5, seed=3, stop="\n",
                           stop_token_ids=[2, 3], ignore_eos=True, model="m", request_id="r1")
    assert req.WhichOneof("prompt") == "text" and req.text == "hello"
    s = req.sampling
    assert (s.max_tokens, s.temperature, s.top_k, s.seed) == (8, 0.0, 5, 3)
    assert s.HasField("temperature")  # an explicit 0 is sent, not left to the default
    assert list(s.stop) == ["\n"] and list(s.stop_token_ids) == [2, 3] and s.ignore_eos
    assert (req.model, req.request_id) == ("m", "r1")
    assert not req.HasField("logprobs")


def test_unset_and_none_options_stay_unset() -> None:
    s = generate_request("x", top_p=None).sampling
    for name in ("max_tokens", "temperature", "top_p", "seed", "skip_special_tokens"):
        assert not s.HasField(name)


def test_chat_messages() -> None:
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    req = generate_request(messages=msgs)
    assert req.WhichOneof("prompt") == "chat"
    assert [(m.role, m.content) for m in req.chat.messages] == [
        ("system", "be brief"), ("user", "hi")]
    assert req.chat.add_generation_prompt
    no_prompt = generate_request(messages=msgs, add_generation_prompt=False)
    assert not no_prompt.chat.add_generation_prompt


def test_token_ids_and_logprobs() -> None:
    req = generate_request(token_ids=[1, 2, 3], logprobs=True, top_logprobs=4)
    assert list(req.token_ids.ids) == [1, 2, 3]
    assert req.logprobs.enabled and req.logprobs.top_logprobs == 4


@pytest.mark.parametrize(
    "args,kwargs",
    [
        ((), {}),
        (("a",), {"messages": [{"role": "user", "content": "b"}]}),
        (("a",), {"token_ids": [1]}),
        ((5,), {}),
        ((), {"messages": "hi"}),
        ((), {"messages": [{"role": "user"}]}),
        ((), {"token_ids": ["x"]}),
        (("a",), {"temprature": 0.5}),
        (("a",), {"max_tokens": -1}),
        (("a",), {"max_tokens": "many"}),
        (("a",), {"temperature": True}),
        (("a",), {"stop_token_ids": ["eos"]}),
        (("a",), {"top_logprobs": -1}),
    ],
)
def test_local_mistakes_raise_invalid_request(args, kwargs) -> None:
    with pytest.raises(InvalidRequest):
        generate_request(*args, **kwargs)


def test_sampling_params_direct() -> None:
    s = sampling_params({"min_p": 0.1, "repetition_penalty": 1.1, "stop": ["a", "b"]})
    assert s.min_p == pytest.approx(0.1) and list(s.stop) == ["a", "b"]


def test_tokenize_request() -> None:
    req = tokenize_request("hi", add_special_tokens=False, model="m")
    assert req.text == "hi" and not req.add_special_tokens and req.model == "m"
    chat = tokenize_request(messages=[{"role": "user", "content": "x"}])
    assert chat.WhichOneof("input") == "chat"
    with pytest.raises(InvalidRequest):
        tokenize_request()
    with pytest.raises(InvalidRequest):
        tokenize_request("a", messages=[{"role": "user", "content": "x"}])


def test_structured_logit_bias_prompt_logprobs_and_tools() -> None:
    req = generate_request(messages=[{"role": "user", "content": "hi"}],
                           structured={"json_schema": {"type": "object"}},
                           logit_bias={"5": -100, 7: 2}, prompt_logprobs=2,
                           tools=[{"type": "function", "function": {"name": "f"}}],
                           tool_choice="required", parallel_tool_calls=False)
    s = req.sampling
    assert s.structured.json_schema == '{"type": "object"}'
    assert dict(s.logit_bias) == {5: -100.0, 7: 2.0} and s.prompt_logprobs == 2
    assert '"name": "f"' in req.chat.tools_json and req.chat.tool_choice == "required"
    assert req.chat.parallel_tool_calls is False
    choice = generate_request("x", structured={"choice": ["a", "b"]}).sampling.structured
    assert list(choice.choice.choices) == ["a", "b"]
    with pytest.raises(InvalidRequest, match="exactly one"):
        generate_request("x", structured={"regex": "a", "grammar": "b"})
    with pytest.raises(InvalidRequest, match="need messages"):
        generate_request("x", tools=[{"type": "function", "function": {"name": "f"}}])
