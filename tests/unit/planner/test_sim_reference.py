"""The simulator's shortcuts against its slow references, and its summary figures.

Macro steps (a decode worker sleeps until its batch changes) must give the per-request
times of stepping one step at a time, and the router's candidate shortcuts the choices of
handing the policies every worker.
"""

from __future__ import annotations

import math

import pytest

from tandem.placement.slo import Slo
from tandem.planner.sim import (
    ClusterSpec,
    Failure,
    RequestOutcome,
    Scale,
    SimResult,
    attainment_curve,
    percentile,
    simulate,
)
from tandem.planner.workload import LengthMix, RequestKind, multiturn, poisson
from tests.unit.planner.test_sim_support import assert_clean, profile

KIND = RequestKind("k", prompt_tokens=(20, 900), output_tokens=(1, 120), prefix_groups=3,
                   prefix_tokens=64)
MIX = LengthMix("m", ((KIND, 1.0),))
EVENTS = [Failure(2.0, "decode", 1), Failure(3.0, "prefill", 0), Scale(4.0, "decode", 5, 1.0),
          Scale(6.0, "decode", 3)]


def _same(a: SimResult, b: SimResult) -> None:
    for x, y in zip(a.outcomes, b.outcomes, strict=True):
        assert (x.decision, x.reason, x.prefill_endpoint, x.decode_endpoint, x.completed,
                x.migrations, x.pushed_bytes) == (y.decision, y.reason, y.prefill_endpoint,
                                                  y.decode_endpoint, y.completed,
                                                  y.migrations, y.pushed_bytes)
        for name in ("ttft_s", "tpot_s", "e2e_s", "itl_max_s"):
            u, v = getattr(x, name), getattr(y, name)
            assert (math.isnan(u) and math.isnan(v)) or u == pytest.approx(v, abs=1e-9), name
    for name in ("prefill_busy", "decode_busy", "decode_mean_rows", "decode_mean_step_s",
                 "decode_rows_per_step"):
        assert getattr(a, name) == pytest.approx(getattr(b, name), rel=1e-9), name


@pytest.mark.parametrize("placement", ["adaptive", "remote", "local"])
def test_macro_steps_match_one_step_at_a_time(placement: str) -> None:
    prof = profile(2e-7, capacity=20_000, seqs=8)  # tight KV and rows: waits and queues
    trace = poisson(60, 8, MIX, seed=1) + multiturn(3, 6, seed=2)
    trace.sort(key=lambda r: r.arrival_s)
    cluster = ClusterSpec(2, 4, placement=placement)
    fast = simulate(cluster, prof, trace, events=EVENTS)
    slow = simulate(cluster, prof, trace, events=EVENTS, exact_steps=True)
    _same(fast, slow)
    assert_clean(fast)
    assert fast.migrations > 0 and fast.events < slow.events


@pytest.mark.parametrize("placement", ["adaptive", "remote"])
def test_candidate_shortcuts_match_the_full_ranking(placement: str) -> None:
    prof = profile(1e-7, capacity=40_000)
    trace = poisson(150, 6, MIX, seed=3)
    cluster = ClusterSpec(6, 12, placement=placement, slo=Slo(0.3, 0.03))
    fast = simulate(cluster, prof, trace, events=EVENTS)
    full = simulate(cluster, prof, trace, events=EVENTS, full_rank=True)
    _same(fast, full)
    assert fast.decisions == full.decisions
    assert_clean(fast)
    if placement == "adaptive":  # the SLO is tight enough for more than one answer
        assert len(fast.decisions) > 1


def test_percentile_is_nearest_rank() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 90) == 5.0
    assert percentile(values, 20) == 1.0
    assert math.isnan(percentile([], 50))


def _outcome(i: int, ttft: float, tpot: float, out: int = 10, done: bool = True
             ) -> RequestOutcome:
    e2e = ttft + tpot * (out - 1)
    return RequestOutcome(i, float(i), 100, out, ttft, tpot, tpot, e2e, "remote", "slo",
                          "p00000", "d00000", 0, 0, done)


def test_summary_attainment_and_goodput() -> None:
    outs = [_outcome(0, 0.5, 0.05), _outcome(1, 3.0, 0.05), _outcome(2, 0.5, 0.2),
            _outcome(3, 0.5, 0.0, out=1), _outcome(4, math.nan, math.nan, done=False)]
    result = SimResult(outs, {("remote", "slo"): 5}, 0, 1.0, 10.0)
    s = result.summary(Slo(2.0, 0.1))
    assert s.requests == 5 and s.completed == 4
    assert s.slo_attainment == pytest.approx(2 / 5)  # the one-token request meets TPOT
    window = 1.0 + 3.0 + 0.05 * 9  # first arrival (0) to the last finish (request 1)
    assert s.goodput_rps == pytest.approx(2 / window)
    assert s.requests_per_s == pytest.approx(4 / window)
    assert s.ttft_p50_s == 0.5 and s.tpot_p99_s == 0.2
    assert s.decisions == {"remote/slo": 5}
    late = result.summary(Slo(2.0, 0.1), warmup_s=2.0)
    assert late.requests == 3


def test_attainment_falls_as_the_rate_rises() -> None:
    trace = poisson(20, 10, MIX, seed=4)
    curve = attainment_curve(ClusterSpec(1, 2), profile(), trace, [5, 50, 400],
                             Slo(0.5, 0.05))
    assert [rate for rate, _ in curve] == [5, 50, 400]
    shares = [share for _, share in curve]
    assert shares[0] >= shares[1] >= shares[2] and shares[0] > shares[2]
