"""A follower's adapter bound: rank 0's, unless the test-only environment lowers one rank's."""

from __future__ import annotations

import pytest

from tandem.engine.parallel.rank_slots import ENV, rank_lora_slots


def test_every_rank_holds_rank_0s_bound_without_the_environment(monkeypatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert [rank_lora_slots(r, 4) for r in (1, 2)] == [4, 4]
    assert rank_lora_slots(1, None) is None


def test_the_environment_lowers_one_rank_only(monkeypatch) -> None:
    monkeypatch.setenv(ENV, "2:1")
    assert [rank_lora_slots(r, 4) for r in (1, 2, 3)] == [4, 1, 4]
    assert rank_lora_slots(2, None) == 1


@pytest.mark.parametrize("value", ["2", "a:1", "1:0", "1:2:3"])
def test_a_malformed_value_is_refused_by_name(monkeypatch, value: str) -> None:
    monkeypatch.setenv(ENV, value)
    with pytest.raises(ValueError, match=ENV):
        rank_lora_slots(1, None)
