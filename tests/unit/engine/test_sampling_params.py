"""SamplingParams.validate: every bad field is refused with an error that names it."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tandem.engine.errors import InvalidRequestError
from tandem.engine.sampling_params import SamplingParams

VOCAB = 1000

INVALID: list[tuple[dict[str, Any], str]] = [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -5}, "max_tokens"),
    ({"max_tokens": 2.5}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 20, "max_tokens": 10}, "min_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": math.nan}, "temperature"),
    ({"temperature": math.inf}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.01}, "top_p"),
    ({"top_p": -0.5}, "top_p"),
    ({"top_p": math.nan}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"top_k": 1.5}, "top_k"),
    ({"min_p": -0.01}, "min_p"),
    ({"min_p": 1.5}, "min_p"),
    ({"min_p": math.nan}, "min_p"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"repetition_penalty": -1.0}, "repetition_penalty"),
    ({"repetition_penalty": math.inf}, "repetition_penalty"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"presence_penalty": -2.5}, "presence_penalty"),
    ({"frequency_penalty": 3.0}, "frequency_penalty"),
    ({"frequency_penalty": math.nan}, "frequency_penalty"),
    ({"seed": -1}, "seed"),
    ({"seed": "42"}, "seed"),
    ({"stop": [""]}, "stop"),
    ({"stop": ["ok", ""]}, "stop"),
    ({"stop": [3]}, "stop"),
    ({"stop": ""}, "stop"),
    ({"stop_token_ids": [VOCAB]}, "stop_token_ids"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"stop_token_ids": [1.0]}, "stop_token_ids"),
    ({"logprobs": -1}, "logprobs"),
    ({"logprobs": 21}, "logprobs"),
    ({"logprobs": 2.0}, "logprobs"),
    ({"seed": 2**64}, "seed"),
    ({"stop": 5}, "stop"),
    ({"stop_token_ids": 5}, "stop_token_ids"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"skip_special_tokens": 1}, "skip_special_tokens"),
]


@pytest.mark.parametrize(("kwargs", "field"), INVALID, ids=[repr(k) for k, _ in INVALID])
def test_invalid_field_is_named(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**kwargs).validate(VOCAB)
    assert err.value.field == field
    assert isinstance(err.value, ValueError)  # callers may catch it as a ValueError


def test_defaults_are_valid() -> None:
    params = SamplingParams()
    params.validate(VOCAB)
    assert not params.greedy and params.stop == [] and params.logprobs is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": 0.0},
        {"top_p": 1.0, "top_k": -1, "min_p": 0.0},
        {"top_k": 0},
        {"top_k": VOCAB * 10},
        {"min_p": 1.0, "top_p": 1e-6},
        {"presence_penalty": -2.0, "frequency_penalty": 2.0},
        {"repetition_penalty": 1e-3},
        {"seed": 0},
        {"min_tokens": 16, "max_tokens": 16},
        {"stop": ["\n\n", "END"], "stop_token_ids": [0, VOCAB - 1]},
        {"logprobs": 0},
        {"logprobs": 20},
    ],
)
def test_edge_values_are_valid(kwargs: dict[str, Any]) -> None:
    SamplingParams(**kwargs).validate(VOCAB)


def test_greedy_means_temperature_zero() -> None:
    assert SamplingParams(temperature=0.0).greedy
    assert not SamplingParams(temperature=1e-3).greedy


def test_a_single_stop_string_becomes_a_list() -> None:
    params = SamplingParams(stop="END")  # type: ignore[arg-type]
    params.validate(VOCAB)
    assert params.stop == ["END"]


def test_none_stop_lists_mean_none() -> None:
    p = SamplingParams(stop=None, stop_token_ids=None)  # type: ignore[arg-type]
    p.validate(VOCAB)
    assert p.stop == [] and p.stop_token_ids == []
