"""``tandem.SamplingOptions``: the typed sampling fields give the same request as the keywords,
mix with them only on distinct fields, and cover exactly the proto's SamplingParams."""

from __future__ import annotations

import dataclasses

import pytest

import tandem
from tandem.sdk.errors import InvalidRequest
from tandem.sdk.request_builder import SAMPLING_FIELDS, generate_request
from tandem.sdk.sampling import SamplingOptions


def test_fields_are_exactly_the_sampling_fields() -> None:
    assert {f.name for f in dataclasses.fields(SamplingOptions)} == SAMPLING_FIELDS
    assert tandem.SamplingOptions is SamplingOptions


def test_typed_equals_keywords() -> None:
    kw = {"max_tokens": 8, "temperature": 0.0, "top_k": 5, "seed": 3, "stop": ["\n", "END"],
          "stop_token_ids": [2], "ignore_eos": True, "logit_bias": {7: -100.0},
          "structured": {"choice": ["yes", "no"]}, "prompt_logprobs": 2}
    typed = generate_request("hi", sampling=SamplingOptions(**kw), model="m")
    assert typed == generate_request("hi", model="m", **kw)
    assert typed.sampling.HasField("temperature")  # an explicit 0 is sent


def test_unset_fields_stay_unset_and_presets_are_immutable() -> None:
    opts = SamplingOptions(max_tokens=4, stop="\n")
    assert opts.as_options() == {"max_tokens": 4, "stop": ("\n",)}  # one string: one stop
    s = generate_request("x", sampling=opts).sampling
    assert list(s.stop) == ["\n"] and not s.HasField("temperature")
    assert SamplingOptions(stop=["a", "b"]).stop == ("a", "b")
    assert hash(SamplingOptions(stop=["a"], stop_token_ids=[1])) is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.max_tokens = 5  # type: ignore[misc]
    assert dataclasses.replace(opts, seed=1).as_options() == {
        "max_tokens": 4, "stop": ("\n",), "seed": 1}


def test_typed_and_keywords_mix_on_distinct_fields_only() -> None:
    mixed = generate_request("x", sampling=SamplingOptions(temperature=0.5), max_tokens=3)
    assert (mixed.sampling.temperature, mixed.sampling.max_tokens) == (0.5, 3)
    # A keyword left at None does not clash (it means "unset").
    assert generate_request("x", sampling=SamplingOptions(seed=2), seed=None).sampling.seed == 2
    with pytest.raises(InvalidRequest, match="max_tokens"):
        generate_request("x", sampling=SamplingOptions(max_tokens=2), max_tokens=3)


def test_bad_sampling_values_are_invalid_requests() -> None:
    with pytest.raises(InvalidRequest, match="SamplingOptions"):
        generate_request("x", sampling={"max_tokens": 3})  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="max_tokens"):
        generate_request("x", sampling=SamplingOptions(max_tokens="many"))  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="structured"):
        generate_request("x", sampling=SamplingOptions(structured={"regex": "a", "choice": []}))
