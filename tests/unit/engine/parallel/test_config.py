"""``EngineConfig.tensor_parallel_size``: validated where the config is built."""

from __future__ import annotations

import pytest

from tandem.engine import EngineConfig


def test_group_size_is_validated() -> None:
    assert EngineConfig.from_kwargs(tensor_parallel_size=3).tensor_parallel_size == 3
    assert EngineConfig().tensor_parallel_size == 1
    with pytest.raises(ValueError, match="tensor_parallel_size must be >= 1, got 0"):
        EngineConfig.from_kwargs(tensor_parallel_size=0)


def test_a_draft_model_is_refused_in_a_group() -> None:
    """The draft model would run on rank 0 alone over a model whose layers all-reduce."""
    with pytest.raises(ValueError, match="draft model"):
        EngineConfig.from_kwargs(tensor_parallel_size=2, speculative_method="draft",
                                 draft_layers=1)
    EngineConfig.from_kwargs(tensor_parallel_size=2, speculative_method="ngram")
