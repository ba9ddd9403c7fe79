"""The decode worker's small pieces on their own: a step's local prefill chunks
(tandem/planner/sim/chunk_plan.py), a row's longest token gap (step_gaps.py), and the step
costs a worker steps by and reports (Profile.served_shape_s, signals.reported_costs)."""

from __future__ import annotations

import dataclasses

import pytest

from tandem.planner.sim.chunk_plan import plan_chunks
from tandem.planner.sim.request import SimRequest
from tandem.planner.sim.signals import FittedSignals, reported_costs
from tandem.planner.sim.step_gaps import StepGaps
from tests.unit.planner.test_sim_support import BASE, PER_ROW, PER_TOKEN, profile


def _job(index: int, tokens: int, done: int) -> SimRequest:
    r = SimRequest(index, 0.0, tokens, 1, -1, 0, 1)
    r.tokens, r.job_done = tokens, done
    return r


def test_chunks_fill_the_budget_from_the_head_and_cut_the_last() -> None:
    a, b, c, d = _job(0, 300, 0), _job(1, 100, 60), _job(2, 500, 0), _job(3, 9, 0)
    chunks, tokens, pairs = plan_chunks([a, b, c, d], 384)
    assert chunks == [(a, 300), (b, 40), (c, 44)]  # d waits: the budget is spent
    assert tokens == 384
    # causal pairs: n x done (cached keys) + n (n + 1) / 2 (its own)
    assert pairs == 300 * 301 / 2 + (40 * 60 + 40 * 41 / 2) + 44 * 45 / 2


def test_chunks_of_a_short_queue_leave_budget_unused() -> None:
    a = _job(0, 10, 4)
    assert plan_chunks([a], 384) == ([(a, 6)], 6, 6 * 4 + 21)
    assert plan_chunks([], 384) == ([], 0, 0.0)


def test_step_gaps_give_the_longest_step_since_a_row_joined() -> None:
    gaps = StepGaps()
    assert gaps.longest_since(0) is None
    for step, length in ((2, 0.02), (6, 0.05), (8, 0.03), (11, 0.01)):
        gaps.record(step, length)
    assert gaps.longest_since(0) == 0.05
    assert gaps.longest_since(6) == 0.05
    assert gaps.longest_since(7) == 0.03  # steps 7-8 ran in the run that ended on 8
    assert gaps.longest_since(9) == 0.01
    assert gaps.longest_since(12) is None
    gaps.record(12, 0.04)  # longer than the two before it: they can never be the answer again
    assert gaps.longest_since(7) == 0.04
    assert gaps.longest_since(3) == 0.05


def test_a_served_step_adds_the_serving_loop_to_the_engine_step() -> None:
    p = dataclasses.replace(profile(), serving_step_s=0.002)
    assert p.served_shape_s(3, 100) == pytest.approx(BASE + 3 * PER_ROW + 100 * PER_TOKEN
                                                     + 0.002)
    assert profile().served_shape_s(3, 100) == profile().step.shape_s(3, 100)


def test_a_worker_reports_the_profile_costs_or_its_own_fit() -> None:
    p = profile()
    assert reported_costs(p, None) == (BASE, PER_ROW, PER_TOKEN)
    signals = FittedSignals(p)
    for rows in (1, 4, 8):  # steps twice as costly a row as the profile says
        signals.step(rows, 0, BASE + 2 * PER_ROW * rows)
    fit = signals.costs()
    assert reported_costs(p, signals) == (fit.base_s, fit.per_row_s, fit.per_prefill_token_s)
    assert fit.per_row_s != PER_ROW
