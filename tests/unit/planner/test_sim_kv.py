"""KV blocks in the simulator: reservations that wait, prefix reuse and prefix-delta pushes."""

from __future__ import annotations

import pytest

from tandem.planner.sim import ClusterSpec, simulate
from tests.unit.planner.test_sim_support import BASE, PER_TOKEN, assert_clean, profile, req

REMOTE = ClusterSpec(1, 1, placement="remote")


def test_reservations_wait_for_room_and_no_request_is_lost() -> None:
    prof = profile(capacity=320)  # 20 blocks; each request needs (100 + 60) / 16 = 10
    trace = [req(0.001 * i, 100, 60) for i in range(5)]
    result = simulate(REMOTE, prof, trace)
    assert_clean(result)
    outs = result.outcomes
    assert all(o.completed for o in outs)
    first_done = min(o.arrival_s + o.e2e_s for o in outs[:2])
    for o in outs[2:]:  # no room until one of the first two finished
        assert o.arrival_s + o.ttft_s > first_done
    starts = [o.arrival_s + o.ttft_s for o in outs]
    assert starts == sorted(starts)  # the router's queue is FIFO


def test_a_request_no_worker_can_hold_is_refused_not_stuck() -> None:
    result = simulate(REMOTE, profile(capacity=320), [req(0.0, 400, 10), req(0.1, 50, 5)])
    big, small = result.outcomes
    assert not big.completed and big.failed == "too_long"
    assert small.completed
    assert_clean(result)


def test_second_turn_pushes_only_its_new_blocks() -> None:
    kv = 1000
    prof = profile(kv_bytes=kv)
    turn0 = req(0.0, 64, 32, group=0, prefix=32, conversation=0)
    # Turn 1 reads turn 0's prompt and reply (96 tokens, six blocks) from the conversation.
    turn1 = req(5.0, 112, 4, group=1, prefix=96, conversation=0)
    result = simulate(REMOTE, prof, [turn0, turn1])
    assert_clean(result)
    first, second = result.outcomes
    assert first.pushed_bytes == 64 * kv
    assert second.pushed_bytes == (112 - 96) * kv  # D holds the first 96 tokens
    # The prefill worker holds turn 0's prompt only (the reply was made on D): 64 tokens.
    assert second.ttft_s == pytest.approx(BASE + PER_TOKEN * 48, abs=1e-12)


def test_shared_system_prompt_is_computed_once_per_worker() -> None:
    prof = profile()
    trace = [req(0.0, 300, 2, group=7, prefix=256), req(1.0, 300, 2, group=7, prefix=256)]
    result = simulate(REMOTE, prof, trace)
    assert_clean(result)
    a, b = result.outcomes
    assert a.ttft_s == pytest.approx(BASE + PER_TOKEN * 300, abs=1e-12)
    assert b.ttft_s == pytest.approx(BASE + PER_TOKEN * 44, abs=1e-12)
    assert b.pushed_bytes == 44 * 1000  # and D reuses its own copy


def test_cached_prefixes_are_evicted_for_reservations() -> None:
    prof = profile(capacity=320)  # 20 blocks
    # Each leaves 8 cached blocks of its group behind; the third needs 19 blocks.
    trace = [req(0.0, 130, 2, group=1, prefix=128), req(1.0, 130, 2, group=2, prefix=128),
             req(2.0, 290, 10)]
    result = simulate(REMOTE, prof, trace)
    assert all(o.completed for o in result.outcomes)
    assert_clean(result)
