"""The simulated router places prompts with the router's own code (cost_model.decide)."""

from __future__ import annotations

import pytest

from tandem.placement.cost_model import Decision, Reason, decide
from tandem.placement.slo import Slo
from tandem.placement.worker_view import Role, WorkerView
from tandem.planner.sim import ClusterSpec, simulate
from tests.unit.planner.test_sim_support import BASE, PER_ROW, assert_clean, profile, req

SLO = Slo(2.0, 0.1)


def test_adaptive_goes_local_when_the_prefill_queue_is_deep() -> None:
    fast_prefill = profile(per_token=1e-5)  # the prefill pool computes prompts 50x faster
    decode = profile(per_token=5e-4)
    cluster = ClusterSpec(1, 1, placement="adaptive", slo=SLO)
    trace = [req(0.0, 20_000, 4), req(0.001, 100, 4)]
    result = simulate(cluster, decode, trace, prefill_profile=fast_prefill)
    assert_clean(result)
    big, small = result.outcomes
    assert (big.decision, big.reason) == ("remote", "slo")  # 0.6 s remote vs 10.4 s local
    # What the router saw for the small one: the big prompt queued on P, reserved on D.
    p = WorkerView("p00000", Role.PREFILL, num_waiting=1, active=1, num_free_blocks=6250,
                   num_blocks=6250, step_base_s=BASE, step_per_row_s=PER_ROW,
                   step_per_prefill_token_s=1e-5, queued_prefill_tokens=20_000,
                   max_batched_tokens=512)
    d = WorkerView("d00000", Role.DECODE, num_running=0, num_waiting=1, active=1,
                   num_free_blocks=6250 - 1251, num_blocks=6250, step_base_s=BASE,
                   step_per_row_s=PER_ROW, step_per_prefill_token_s=5e-4,
                   max_batched_tokens=512)
    expected = decide(100, d, [p], SLO, cached={"d00000": 0})
    assert (expected.decision, expected.reason) == (Decision.LOCAL, Reason.SLO)
    assert (small.decision, small.reason) == ("local", "slo")
    assert small.prefill_endpoint == ""
    # The model counted the big request's row; D had none yet, so the prompt ran alone.
    assert expected.predicted is not None
    assert small.ttft_s == pytest.approx(expected.predicted.ttft_s - PER_ROW, abs=1e-12)
    assert result.decisions == {("remote", "slo"): 1, ("local", "slo"): 1}


def test_threshold_override_splits_by_prompt_length() -> None:
    cluster = ClusterSpec(1, 1, local_prefill_threshold=150)
    result = simulate(cluster, profile(), [req(0.0, 100, 3), req(0.5, 200, 3)])
    assert_clean(result)
    short, long_ = result.outcomes
    assert (short.decision, short.reason) == ("local", "threshold")
    assert (long_.decision, long_.reason) == ("remote", "threshold")
    assert long_.prefill_endpoint == "p00000"


def test_no_prefill_worker_means_colocated() -> None:
    result = simulate(ClusterSpec(0, 2), profile(), [req(0.1 * i, 80, 3) for i in range(4)])
    assert_clean(result)
    assert result.decisions == {("local", "colocated"): 4}
    assert all(o.pushed_bytes == 0 for o in result.outcomes)


def test_local_placement_ignores_the_prefill_pool() -> None:
    result = simulate(ClusterSpec(2, 1, placement="local"), profile(), [req(0.0, 80, 3)])
    assert result.decisions == {("local", "colocated"): 1}
    assert_clean(result)


def test_remote_placement_balances_prefill_workers() -> None:
    trace = [req(0.0, 500, 2) for _ in range(4)]
    result = simulate(ClusterSpec(2, 1, placement="remote"), profile(), trace)
    assert_clean(result)
    assert [o.prefill_endpoint for o in result.outcomes] == ["p00000", "p00001"] * 2
