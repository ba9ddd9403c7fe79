"""Failures and scale events: retried prefills, migrated streams, joins after start-up,
drains that finish their work."""

from __future__ import annotations

from tandem.placement.worker_view import Role
from tandem.planner.sim import ClusterSpec, Failure, Scale, simulate
from tests.unit.planner.test_sim_support import assert_clean, profile, req


def test_killed_decode_worker_streams_finish_elsewhere() -> None:
    kv = 1000
    trace = [req(0.01 * i, 100, 200) for i in range(6)]  # ~2 s of decoding each
    result = simulate(ClusterSpec(1, 2, placement="remote"), profile(kv_bytes=kv), trace,
                      events=[Failure(1.0, Role.DECODE, 0)])
    assert_clean(result)
    moved = [o for o in result.outcomes if o.migrated]
    assert moved and result.migrations == len(moved)
    for o in result.outcomes:
        assert o.completed
        assert o.decode_endpoint == "d00001"  # where every stream ended
    for o in moved:  # the new leg prefilled the prompt and the tokens already sent
        assert o.pushed_bytes > 2 * 100 * kv


def test_migrations_are_bounded() -> None:
    trace = [req(0.0, 100, 400)]
    events = [Failure(0.5, "decode", 0), Failure(1.0, "decode", 1)]
    result = simulate(ClusterSpec(1, 3, placement="remote", max_migrations=1), profile(),
                      trace, events=events)
    (o,) = result.outcomes
    assert not o.completed and o.failed == "migrations" and o.migrations == 2
    assert result.leaked_blocks == 0


def test_killed_prefill_worker_jobs_are_retried() -> None:
    trace = [req(0.0, 4000, 2) for _ in range(4)]  # P0 gets two, P1 two: ~0.5 s each
    result = simulate(ClusterSpec(2, 1, placement="remote"), profile(), trace,
                      events=[Failure(0.1, "prefill", 0)])
    assert_clean(result)
    assert result.prefill_retries == 2
    assert all(o.completed and o.prefill_endpoint == "p00001" for o in result.outcomes)


def test_last_prefill_worker_dying_falls_back_to_local() -> None:
    result = simulate(ClusterSpec(1, 1, placement="remote"), profile(), [req(0.0, 4000, 2)],
                      events=[Failure(0.1, "prefill", 0)])
    assert_clean(result)
    assert result.local_fallbacks == 1 and result.outcomes[0].completed


def test_scale_up_adds_capacity_after_startup() -> None:
    prof = profile(capacity=320)  # one request (10 blocks) ... two at a time per worker
    trace = [req(0.05 * i, 100, 60) for i in range(12)]
    events = [Scale(0.2, Role.DECODE, 2, startup_s=0.5)]
    result = simulate(ClusterSpec(0, 1), prof, trace, events=events)
    assert_clean(result)
    late = [o for o in result.outcomes if o.decode_endpoint == "d00001"]
    assert late
    assert all(o.arrival_s + o.ttft_s >= 0.7 for o in late)
    base = simulate(ClusterSpec(0, 1), prof, trace)
    assert max(o.e2e_s for o in result.outcomes) < max(o.e2e_s for o in base.outcomes)


def test_scale_down_drains_without_dropping() -> None:
    trace = [req(0.05 * i, 100, 100) for i in range(20)]
    result = simulate(ClusterSpec(1, 2, placement="remote"), profile(), trace,
                      events=[Scale(0.3, "decode", 1), Scale(0.3, "prefill", 0)])
    assert_clean(result)
    assert result.migrations == 0
    for o in result.outcomes:
        assert o.completed
        if o.arrival_s > 0.3:
            assert o.decode_endpoint == "d00000"
            assert o.decision == "local"  # no prefill worker left: colocated
    assert any(o.decode_endpoint == "d00001" for o in result.outcomes)  # finished there


def test_scale_down_cancels_workers_still_starting() -> None:
    events = [Scale(0.0, "decode", 3, startup_s=5.0), Scale(1.0, "decode", 1)]
    result = simulate(ClusterSpec(0, 1), profile(), [req(6.0, 50, 3)], events=events)
    assert result.outcomes[0].decode_endpoint == "d00000"
    assert_clean(result)
