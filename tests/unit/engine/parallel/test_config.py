"""``EngineConfig.tensor_parallel_size``: validated where the config is built."""

from __future__ import annotations

import pytest

from tandem.engine import EngineConfig


def test_group_size_is_validated() -> None:
    assert EngineConfig.from_kwargs(tensor_parallel_size=3).tensor_parallel_size == 3
    assert EngineConfig().tensor_parallel_size == 1
    with pytest.raises(ValueError, match="tensor_parallel_size must be >= 1, got 0"):
        EngineConfig.from_kwargs(tensor_parallel_size=0)


def test_a_first_layers_draft_is_refused_in_a_group() -> None:
    """The target's first layers would run on rank 0 alone, yet they are split and
    all-reduce; a draft checkpoint of its own runs whole on rank 0."""
    with pytest.raises(ValueError, match="first layers .* tensor-parallel group"):
        EngineConfig.from_kwargs(tensor_parallel_size=2, speculative_method="draft",
                                 draft_layers=1)
    EngineConfig.from_kwargs(tensor_parallel_size=2, speculative_method="draft",
                             draft_model="some-draft")
    EngineConfig.from_kwargs(tensor_parallel_size=2, speculative_method="ngram")
