"""The autoscaler's policies inside the simulator (tandem/planner/autoscale.py): hand-checkable runs."""

from __future__ import annotations

import dataclasses

import pytest

from tandem.autoscaler.config import (
    AutoscaleConfig,
    Bounds,
    Cooldown,
    CoupledTargets,
    FixedCounts,
    QueueTargets,
)
from tandem.common.obs.histogram import histogram_quantile
from tandem.placement.slo import TTFT_BUCKETS
from tandem.planner.autoscale import AutoscaledResult, compare_policies, simulate_autoscaled
from tandem.planner.sim import ClusterSpec, Scale, simulate
from tandem.planner.sim.router import SimRouter
from tests.unit.planner.test_sim_support import assert_clean, profile, req

REMOTE = ClusterSpec(1, 1, placement="remote")
# A burst of 2,000-token prompts (one prefill worker takes ~0.2 s each: 20/s arrive), then
# a trickle of small requests after a quiet minute.
BURST = ([req(i * 0.05, 2000, 20) for i in range(200)]
         + [req(100.0 + i, 100, 5) for i in range(60)])


def queue_config(**kw: object) -> AutoscaleConfig:
    base = AutoscaleConfig(policy="queue", interval_s=5, window_s=10, stabilization_s=20,
                           cooldown=Cooldown(10, 20), prefill=Bounds(1, 4),
                           decode=Bounds(1, 2))
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def check(run: AutoscaledResult) -> None:
    """No leak, nothing stranded, every request completed."""
    assert_clean(run.sim)
    assert all(o.completed for o in run.sim.outcomes)


def test_queue_policy_scales_prefill_up_for_a_burst_then_back_down() -> None:
    run = simulate_autoscaled(REMOTE, profile(), BURST, queue_config(), startup_s=5)
    check(run)
    prefill = [e for e in run.scale_events if e.role == "prefill"]
    ups = [e for e in prefill if e.new > e.old]
    downs = [e for e in prefill if e.new < e.old]
    assert ups and downs and ups[0].t < downs[0].t
    assert max(e.new for e in prefill) == 4 and prefill[-1].new == 1
    assert run.decisions == 2 * len(range(0, int(run.sim.simulated_s) + 1, 5))
    span = run.sim.simulated_s
    assert 1 * span < run.gpu_seconds["prefill"] < 4 * span
    # The fixed policy at the bounds brackets the autoscaled cost.
    low = simulate_autoscaled(REMOTE, profile(), BURST,
                              queue_config(policy="fixed"), startup_s=5)
    high = simulate_autoscaled(ClusterSpec(4, 1, placement="remote"), profile(), BURST,
                               queue_config(policy="fixed", fixed=FixedCounts(4, 1),
                                            prefill=Bounds(1, 4)), startup_s=5)
    check(low)
    check(high)
    assert low.gpu_seconds["prefill"] < run.gpu_seconds["prefill"] < high.gpu_seconds["prefill"]
    # More prefill workers during the burst: a shorter TTFT tail than one worker's.
    assert run.sim.summary(REMOTE.slo).ttft_p90_s < low.sim.summary(REMOTE.slo).ttft_p90_s


def test_fixed_policy_never_scales() -> None:
    run = simulate_autoscaled(ClusterSpec(2, 1, placement="remote"), profile(), BURST,
                              queue_config(policy="fixed", fixed=FixedCounts(2, 1)))
    check(run)
    assert run.scale_events == []
    span = run.sim.simulated_s
    assert run.gpu_seconds == {"prefill": pytest.approx(2 * span), "decode": pytest.approx(span)}


def test_cooldowns_hold_between_scale_events_of_a_role() -> None:
    cfg = queue_config(cooldown=Cooldown(15, 40), stabilization_s=0,
                       queue=QueueTargets(prefill_queue_depth=2, prefill_queue_tokens=2048))
    wavy = [req(60.0 * k + i * 0.05, 2000, 20) for k in range(3) for i in range(100)]
    run = simulate_autoscaled(REMOTE, profile(), wavy, cfg, startup_s=5)
    check(run)
    for role in ("prefill", "decode"):
        events = [e for e in run.scale_events if e.role == role]
        for a, b in zip(events, events[1:], strict=False):
            need = cfg.cooldown.up_s if b.new > b.old else cfg.cooldown.down_s
            assert b.t - a.t >= need, (a, b)
    assert sum(1 for e in run.scale_events if e.role == "prefill") >= 3


def test_gpu_seconds_is_the_worker_count_integral() -> None:
    # t = 0: prefill 1 -> 3 (two start, join at 10 s: counted while starting), decode 2 -> 1
    # (the idle second worker drains at once). Then nothing changes: 3 x T and 1 x T.
    prof = dataclasses.replace(profile(), gpus_per_worker=2)
    cfg = queue_config(policy="fixed", fixed=FixedCounts(3, 1), decode=Bounds(1, 2),
                       stabilization_s=0)
    run = simulate_autoscaled(ClusterSpec(1, 2, placement="remote"), prof,
                              [req(1.0 + i // 3, 500, 10) for i in range(90)], cfg, startup_s=10)
    check(run)
    assert [(e.t, e.role, e.old, e.new) for e in run.scale_events] == [
        (0.0, "prefill", 1, 3), (0.0, "decode", 2, 1)]
    span = run.sim.simulated_s
    assert span == pytest.approx(35.0)  # the tick after the last request ended at ~30 s
    assert run.gpu_seconds["prefill"] == pytest.approx(3 * span * 2)
    assert run.gpu_seconds["decode"] == pytest.approx(1 * span * 2)
    assert run.gpu_hours == pytest.approx(4 * span * 2 / 3600)
    # Three at a time: after t = 10 s they use the workers that joined then.
    late = {o.prefill_endpoint for o in run.sim.outcomes if o.arrival_s > 10.5}
    assert late == {"p00000", "p00001", "p00002"}


def test_decode_scale_down_while_streams_run_completes_every_request() -> None:
    # Two long streams, then 40 short ones, fill d0 (16 rows + 26 waiting: the window's mean
    # depth is 21 at 5 s): at 5 s decode goes 1 -> 2 (d1 joins at 6 s); six long streams
    # arriving 7..12 s land on d1. Once d0's burst is done the pool is below one replica's
    # threshold: the worker with fewer streams, d0 (two), drains with them still running.
    trace = ([req(0.05 + i * 0.001, 100, 3000) for i in range(2)]
             + [req(0.1 + i * 0.001, 100, 300) for i in range(40)]
             + [req(7.0 + i, 100, 3000) for i in range(6)])
    cfg = queue_config(stabilization_s=5, cooldown=Cooldown(5, 5), prefill=Bounds(1, 1))
    run = simulate_autoscaled(REMOTE, profile(), trace, cfg, startup_s=1)
    check(run)
    decode = [e for e in run.scale_events if e.role == "decode"]
    assert [(e.old, e.new) for e in decode] == [(1, 2), (2, 1)]
    up, down = decode
    assert up.t == 5.0
    on_d0 = [o for o in run.sim.outcomes if o.decode_endpoint == "d00000"]
    on_d1 = [o for o in run.sim.outcomes if o.decode_endpoint == "d00001"]
    assert (len(on_d0), len(on_d1)) == (42, 6)
    last_d0 = max(o.arrival_s + o.e2e_s for o in on_d0)
    assert last_d0 > down.t + 10  # still streaming long after the drain began
    span = run.sim.simulated_s  # d0 lives to its last token, d1 from 5 s to the end
    assert run.gpu_seconds["decode"] == pytest.approx(last_d0 + (span - up.t))


def test_compare_policies_rows_and_table() -> None:
    cfg = queue_config(fixed=FixedCounts(1, 1))
    rows, table = compare_policies(REMOTE, profile(), BURST, cfg, startup_s=5)
    assert [r.policy for r in rows] == ["fixed", "queue", "slo"]
    assert rows[0].scale_events == 0 and rows[1].scale_events > 0
    assert all(r.completed == r.requests == len(BURST) for r in rows)
    assert all(0 <= r.attainment <= 1 and r.gpu_hours > 0 for r in rows)
    assert table.splitlines()[0].startswith("policy") and len(table.splitlines()) == 5


def test_simulated_router_counts_what_the_real_one_exports() -> None:
    """tandem/planner/sim/tallies.py: TTFT and TPOT histograms, admissions, tokens, as the router's
    /metrics has them, agree with the run's own outcomes."""
    seen: list[SimRouter] = []
    trace = [req(i * 0.1, 200 + 10 * i, 1 + i % 7) for i in range(60)]
    result = simulate(REMOTE, profile(), trace, on_tick=lambda _t, r, _p: seen.append(r),
                      tick_s=1.0)
    assert_clean(result)
    t = seen[-1].tallies
    done = [o for o in result.outcomes if o.completed]
    assert len(done) == len(trace) == t.admitted == t.finished == t.ttft.cumulative()[-1][1]
    assert t.prompt_tokens == sum(r.prompt_tokens for r in trace)
    assert t.finished_tokens == sum(r.output_tokens for r in trace)
    assert t.tpot.cumulative()[-1][1] == sum(1 for r in trace if r.output_tokens > 1)
    ttft_p90 = histogram_quantile(t.ttft.cumulative(), 0.9)
    exact = sorted(o.ttft_s for o in done)[int(0.9 * len(done)) - 1]
    bounds = [0.0, *TTFT_BUCKETS]
    assert any(lo <= exact <= hi and lo <= ttft_p90 <= hi
               for lo, hi in zip(bounds, bounds[1:], strict=False))  # the same bucket


def test_scale_event_drains_the_named_victims() -> None:
    # Two decode workers take the first requests; at 2 s the pool shrinks to one, naming
    # d00000 (not the newest): it takes nothing new, d00001 serves the rest.
    trace = [req(i * 0.1, 100, 20) for i in range(60)]
    result = simulate(ClusterSpec(1, 2, placement="remote"), profile(), trace,
                      events=[Scale(2.0, "decode", 1, victims=("d00000",))])
    assert_clean(result)
    late = {o.decode_endpoint for o in result.outcomes if o.arrival_s > 2.0}
    early = {o.decode_endpoint for o in result.outcomes if o.arrival_s < 2.0}
    assert late == {"d00001"} and early == {"d00000", "d00001"}


def test_coupled_policy_in_the_simulator_sizes_both_pools_and_drains_safely() -> None:
    cfg = queue_config(policy="coupled", coupled=CoupledTargets(ttft_p90_s=2.0, tpot_p90_s=0.1,
                                                                lead_s=5, max_rows=16))
    run = simulate_autoscaled(REMOTE, profile(), BURST, cfg, startup_s=5)
    check(run)
    prefill = [e for e in run.scale_events if e.role == "prefill"]
    assert prefill[0].new > prefill[0].old and prefill[-1].new == 1
    assert max(e.new for e in prefill) == 4  # the burst needs ~7: held to prefill.max
    assert run.sim.summary(REMOTE.slo).ttft_p90_s < simulate_autoscaled(
        REMOTE, profile(), BURST, queue_config(policy="fixed"), startup_s=5
    ).sim.summary(REMOTE.slo).ttft_p90_s
