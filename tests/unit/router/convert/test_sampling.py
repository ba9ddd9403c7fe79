"""Sampling settings and logprobs cross the edges unchanged: a client's SamplingParams becomes
a SamplingSpec and goes out to a worker as the same message, unset fields still unset."""

from __future__ import annotations

import math

import pytest

from tandem.protos.v1 import tandem_pb2
from tandem.router.api.response import TokenLogprob, TopLogprob
from tandem.router.api.sampling import LogprobOptions, SamplingSpec, StructuredOutput
from tandem.router.convert.sampling import (
    logprob_options_from_proto,
    logprob_options_to_proto,
    sampling_from_proto,
    sampling_to_proto,
    token_logprobs_from_proto,
    token_logprobs_to_proto,
)

EVERY_FIELD = tandem_pb2.SamplingParams(
    max_tokens=7, min_tokens=2, temperature=0.5, top_p=0.25, top_k=-1, min_p=0.0,
    repetition_penalty=1.5, presence_penalty=-2.0, frequency_penalty=0.0, seed=0,
    stop=["\n", "END"], stop_token_ids=[3, 4], ignore_eos=True, include_stop_str_in_output=True,
    skip_special_tokens=False, speculative=False, logit_bias={5: -100.0, 9: 2.5},
    prompt_logprobs=0, structured=tandem_pb2.StructuredOutput(regex="[0-9]+"),
)


def test_every_field_round_trips_and_zero_values_stay_set() -> None:
    plain = sampling_from_proto(EVERY_FIELD)
    assert plain.seed == 0 and plain.min_p == 0.0 and plain.prompt_logprobs == 0
    assert plain.skip_special_tokens is False and plain.speculative is False
    assert plain.stop == ("\n", "END") and plain.stop_token_ids == (3, 4)
    assert plain.logit_bias == {5: -100.0, 9: 2.5}
    assert plain.structured == StructuredOutput("regex", "[0-9]+")
    assert sampling_to_proto(plain) == EVERY_FIELD


def test_unset_fields_stay_unset() -> None:
    plain = sampling_from_proto(tandem_pb2.SamplingParams())
    assert plain == SamplingSpec()
    out = sampling_to_proto(plain)
    assert out == tandem_pb2.SamplingParams()
    assert not any(out.HasField(name) for name in (
        "max_tokens", "temperature", "seed", "skip_special_tokens", "speculative", "structured",
        "prompt_logprobs"))


@pytest.mark.parametrize("structured", [
    tandem_pb2.StructuredOutput(json_schema='{"type":"object"}'),
    tandem_pb2.StructuredOutput(json_object=True),
    tandem_pb2.StructuredOutput(json_object=False),  # set, though false: still a kind
    tandem_pb2.StructuredOutput(regex="a+"),
    tandem_pb2.StructuredOutput(choice=tandem_pb2.ChoiceList(choices=["yes", "no"])),
    tandem_pb2.StructuredOutput(grammar='root ::= "a"'),
])
def test_each_structured_kind_round_trips(structured: tandem_pb2.StructuredOutput) -> None:
    message = tandem_pb2.SamplingParams(structured=structured)
    plain = sampling_from_proto(message)
    assert plain.structured is not None
    assert plain.structured.kind == structured.WhichOneof("kind")
    assert sampling_to_proto(plain) == message


def test_a_structured_output_without_a_kind_is_none() -> None:
    message = tandem_pb2.SamplingParams(structured=tandem_pb2.StructuredOutput())
    assert message.HasField("structured")
    assert sampling_from_proto(message).structured is None


def test_logprob_options_and_logprobs_round_trip() -> None:
    options = tandem_pb2.LogprobOptions(enabled=True, top_logprobs=3)
    assert logprob_options_from_proto(options) == LogprobOptions(True, 3)
    assert logprob_options_to_proto(LogprobOptions(True, 3)) == options
    wire = [tandem_pb2.TokenLogprob(token_id=1, logprob=math.nan),
            tandem_pb2.TokenLogprob(token_id=2, logprob=-0.5, top=[
                tandem_pb2.TopLogprob(token_id=3, logprob=-1.0)])]
    plain = token_logprobs_from_proto(wire)
    assert plain[1] == TokenLogprob(2, -0.5, (TopLogprob(3, -1.0),))
    assert math.isnan(plain[0].logprob) and plain[0].top == ()
    back = token_logprobs_to_proto(plain)
    assert back[1] == wire[1] and back[0].token_id == 1 and math.isnan(back[0].logprob)
