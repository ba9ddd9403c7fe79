"""The router reads a worker's prompt queue from its last report or its own count (reports.py)."""

from __future__ import annotations

import pytest

from tandem.placement.slo import Slo
from tandem.planner.sim import ClusterError, ClusterSpec, simulate
from tandem.planner.sim.reports import ReportedQueue
from tests.unit.planner.test_sim_support import assert_clean, profile, req

SLO = Slo(4.0, 0.25)


def test_a_report_keeps_the_queue_it_read_until_the_next() -> None:
    q = ReportedQueue(2.0)
    assert q.seen(0, 0.0) == 0  # the report at 0 s: empty
    q.before_change(0, 0.5)  # 800 tokens queued at 0.5 s
    assert q.seen(800, 1.0) == 800  # the router's own count is exact
    q.before_change(800, 3.1)  # they leave at 3.1 s; the report at 2 s still has them
    assert q.seen(0, 3.5) == 800
    assert q.seen(0, 4.0) == 0  # the report at 4 s: empty again


def test_a_queue_that_fills_and_empties_between_reports_is_never_reported() -> None:
    """A queue that fills and empties between two reports never reaches one."""
    q = ReportedQueue(1.0)
    assert q.seen(0, 0.1) == 0
    q.before_change(0, 0.2)
    q.before_change(300, 0.7)
    assert q.seen(0, 1.5) == 0


def test_no_interval_is_the_exact_queue() -> None:
    q = ReportedQueue(0.0)
    q.before_change(500, 1.0)
    assert q.seen(0, 1.5) == 0
    with pytest.raises(ValueError):
        ReportedQueue(-1.0)
    with pytest.raises(ClusterError):
        ClusterSpec(1, 1, report_interval_s=-0.5)


def _queued_seen(interval_s: float, second_s: float) -> int:
    """A 5,000-token prompt goes remote at 0 s, a 100-token one arrives at ``second_s``:
    the prefill queue the router saw for the second."""
    log: list[dict] = []
    result = simulate(ClusterSpec(1, 1, slo=SLO, signals="profile",
                                  report_interval_s=interval_s),
                      profile(per_token=5e-4), [req(0.0, 5000, 4), req(second_s, 100, 4)],
                      prefill_profile=profile(per_token=1e-4), placement_log=log)
    assert_clean(result)
    assert result.outcomes[0].decision == "remote"
    return log[1]["prefill"][0]["queued"]


def test_the_simulated_router_sees_a_long_prompt_a_report_after_it_left() -> None:
    """The long prompt's prefill (10 steps of ~61 ms) ends at ~0.61 s. A request at 0.7 s
    sees an empty queue when every report is current; with a report every 0.4 s the last
    one (0.4 s) still holds the tokens left then."""
    assert _queued_seen(0.0, 0.7) == 0
    assert 0 < _queued_seen(0.4, 0.7) < 5000
    assert _queued_seen(0.4, 0.85) == 0  # the report at 0.8 s: the queue had emptied
