"""Role flips in the simulator: the worker serves its new role ``flip_s`` after it is empty;
a decode worker's streams move by live migration (their KV over the link) or by re-prefill;
a prefill worker finishes its queued prompts first; runs are deterministic; the coupled
autoscaler flips in the simulator and a flipped worker's GPUs are counted once."""

from __future__ import annotations

import dataclasses

import pytest

from tandem.autoscaler.config import (
    AutoscaleConfig,
    Bounds,
    Cooldown,
    CoupledTargets,
    FlipSettings,
    MaxStep,
)
from tandem.placement.worker_view import Role
from tandem.planner.autoscale import simulate_autoscaled
from tandem.planner.sim import (
    ClusterError,
    ClusterSpec,
    HostSharing,
    RoleFlip,
    Scale,
    simulate,
)
from tandem.planner.sim.results import SimResult
from tandem.planner.trace import TraceRequest
from tests.unit.planner.test_sim_support import assert_clean, profile, req

KV = 1000  # bytes per token
STREAMS = [req(0.01 * i, 100, 300) for i in range(6)]  # ~3 s of decoding each
LATE = [req(2.0 + 0.02 * i, 2000, 5) for i in range(10)]  # prompts after the flip
FLIP_D0 = RoleFlip(1.0, Role.DECODE, 0, flip_s=0.5)


def flipped_decode(live: bool) -> SimResult:
    cluster = ClusterSpec(1, 2, placement="remote", live_migration=live)
    return simulate(cluster, profile(kv_bytes=KV), STREAMS + LATE, events=[FLIP_D0])


def test_decode_worker_flips_to_prefill_after_the_flip_time_moving_its_streams_live() -> None:
    result = flipped_decode(live=True)
    assert_clean(result)  # d0's blocks too: every reservation on it was released
    assert all(o.completed for o in result.outcomes)
    moved = [o for o in result.outcomes if o.migrated]
    assert moved and result.live_migrations == len(moved) == result.migrations
    for o in moved:
        assert o.decode_endpoint == "d00001"
        # The KV of the prompt and the tokens sent crossed the link; nothing re-prefilled.
        assert 2 * 100 * KV < o.pushed_bytes <= (2 * 100 + 300) * KV
    assert result.migrated_bytes == sum(o.pushed_bytes - 100 * KV for o in moved)
    # d0 came back as prefill worker p00001, serving from 1.0 + flip_s on.
    on_new = [o for o in result.outcomes if o.prefill_endpoint == "p00001"]
    assert on_new and all(o.arrival_s + o.ttft_s >= 1.5 for o in on_new)
    assert all(o.decode_endpoint == "d00001" for o in result.outcomes if o.arrival_s > 1.0)


def test_without_live_migration_the_streams_are_re_prefilled() -> None:
    live, again = flipped_decode(live=True), flipped_decode(live=False)
    assert_clean(again)
    assert again.live_migrations == 0 and again.migrated_bytes == 0
    moved = [o for o in again.outcomes if o.migrated]
    assert moved and again.migrations == len(moved)
    for o in moved:  # a new prefill of prompt + tokens sent pushed its KV again
        assert o.pushed_bytes > 2 * 100 * KV and o.completed
    # Live migration moves KV instead of recomputing it: the moved streams end sooner.
    by = {o.index: o for o in live.outcomes}
    assert sum(by[o.index].e2e_s for o in moved) < sum(o.e2e_s for o in moved)


def test_prefill_worker_finishes_its_queue_then_serves_decode_after_the_flip_time() -> None:
    queued = [req(0.0, 4000, 2) for _ in range(4)]  # ~0.4 s each, two queued on p0
    later = [req(3.0 + 0.05 * i, 100, 50) for i in range(20)]
    cluster = ClusterSpec(2, 1, placement="remote")
    result = simulate(cluster, profile(), queued + later,
                      events=[RoleFlip(0.1, Role.PREFILL, 0, flip_s=0.5)])
    assert_clean(result)
    assert result.prefill_retries == 0  # nothing queued on p0 was dropped
    on_p0 = [o for o in result.outcomes if o.prefill_endpoint == "p00000"]
    assert len(on_p0) == 2 and all(o.completed for o in on_p0)
    emptied = max(o.arrival_s + o.ttft_s for o in on_p0)
    on_new = [o for o in result.outcomes if o.decode_endpoint == "d00001"]
    assert on_new and all(o.arrival_s + o.ttft_s >= emptied + 0.5 for o in on_new)
    assert all(o.prefill_endpoint != "p00000" for o in result.outcomes if o.arrival_s > 0.1)


def test_a_decrease_cancels_cold_starts_before_a_flipped_worker() -> None:
    # Prefill: p0 serving, p1 starting cold (5 s), then d0 flips in as p2; a decrease to 2
    # cancels p1, not the flip that serves sooner.
    events = [Scale(0.0, Role.PREFILL, 2, startup_s=5.0), FLIP_D0,
              Scale(1.1, Role.PREFILL, 2)]
    result = simulate(ClusterSpec(1, 2, placement="remote"), profile(kv_bytes=KV),
                      STREAMS + LATE + [req(6.0 + 0.02 * i, 2000, 5) for i in range(10)],
                      events=events)
    assert_clean(result)
    used = {o.prefill_endpoint for o in result.outcomes}
    assert "p00002" in used and "p00001" not in used


def test_flips_are_deterministic_and_refused_with_host_sharing() -> None:
    def run() -> list[tuple[object, ...]]:
        r = flipped_decode(live=True)
        return [dataclasses.astuple(o) for o in r.outcomes]

    assert run() == run()
    shared = ClusterSpec(1, 2, placement="remote", host_sharing=HostSharing())
    with pytest.raises(ClusterError, match="host sharing"):
        simulate(shared, profile(), STREAMS, events=[FLIP_D0])


def mix_config(enabled: bool) -> AutoscaleConfig:
    return AutoscaleConfig(
        policy="coupled", interval_s=1, window_s=4, stabilization_s=10,
        cooldown=Cooldown(2, 4), max_step=MaxStep(4, 4), prefill=Bounds(1, 6),
        decode=Bounds(1, 6),
        coupled=CoupledTargets(ttft_p90_s=2.0, tpot_p90_s=0.1, lead_s=20, trend_s=10,
                               max_rows=16),
        flip=FlipSettings(enabled=enabled, flip_s=1.0, window_s=2.0))


def chat_to_rag(seconds: float = 120.0, ramp: tuple[float, float] = (20.0, 80.0)
                ) -> list[TraceRequest]:
    """5 requests/s throughout, chat (100 in, 400 out) turning RAG (3,000 in, 1 out)
    linearly over ``ramp``; arrivals evenly spaced (no randomness)."""
    out: list[TraceRequest] = []
    chat = rag = t = 0.0
    while t < seconds:
        k = min(max((t - ramp[0]) / (ramp[1] - ramp[0]), 0.0), 1.0)
        chat, rag = chat + 5 * (1 - k) * 0.01, rag + 5 * k * 0.01
        if chat >= 1:
            out.append(req(t, 100, 400))
            chat -= 1
        if rag >= 1:
            out.append(req(t, 3000, 1))
            rag -= 1
        t += 0.01
    return out


def test_coupled_autoscaler_flips_in_the_simulator_and_counts_gpus_once() -> None:
    cluster = ClusterSpec(1, 4, placement="remote")
    trace = chat_to_rag()
    flips = simulate_autoscaled(cluster, profile(), trace, mix_config(True), startup_s=20)
    cold = simulate_autoscaled(cluster, profile(), trace, mix_config(False), startup_s=20)
    for run in (flips, cold):
        assert_clean(run.sim)
        assert all(o.completed for o in run.sim.outcomes)
    assert cold.flips == [] and flips.flips
    assert all((f.source, f.target) == ("decode", "prefill") for f in flips.flips)
    assert flips.sim.live_migrations > 0
    # A flipped worker's old span ends where its new one starts: one set of GPUs.
    for f in flips.flips:
        assert ("decode", f.t) in [(r, end) for r, _, end in flips.spans]
        assert ("prefill", f.t) in [(r, start) for r, start, _ in flips.spans]
    # The mix shift served as well, on fewer GPU-hours (no cold start for the flipped).
    slo = cluster.slo
    assert flips.sim.summary(slo).slo_attainment >= cold.sim.summary(slo).slo_attainment
    assert flips.gpu_hours < cold.gpu_hours
