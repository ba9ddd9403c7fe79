"""A live move's gap in seconds and in the source's decode steps, on a stepped clock."""

from __future__ import annotations

import pytest

from tandem.router.handoff.counters import HandoffCounters
from tandem.router.handoff.move_gap import WINDOW, MoveGap


class Clock:
    """A clock the test advances."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_gap_over_the_mean_spacing_of_the_last_tokens() -> None:
    counters, clock = HandoffCounters(), Clock()
    gap = MoveGap(counters, clock)
    for spacing in [1.0] * 5 + [0.01] * WINDOW:  # only the last WINDOW tokens count
        clock.now += spacing
        assert not gap.tick(1)
    gap.moved()
    clock.now += 0.025  # 2.5 steps of 10 ms
    assert gap.tick(1)
    assert counters.move_gap.total == pytest.approx(0.025)
    assert counters.move_gap_steps.total == pytest.approx(2.5)
    assert sum(counters.move_gap_steps.counts) == 1
    clock.now += 0.01
    assert not gap.tick(1)  # one gap per move


def test_a_chunk_of_several_tokens_spaces_each_and_a_stay_measures_nothing() -> None:
    counters, clock = HandoffCounters(), Clock()
    gap = MoveGap(counters, clock)
    clock.now += 0.04
    gap.tick(4)  # 4 tokens in 40 ms: 10 ms each
    gap.moved()
    clock.now += 0.03
    gap.tick(2)
    assert counters.move_gap_steps.total == pytest.approx(3.0)
    clock.now += 0.01
    gap.tick(1)  # no move asked since: no gap
    assert sum(counters.move_gap.counts) == 1
