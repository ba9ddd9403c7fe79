"""Routing policies: pure ranking functions over worker snapshots, no I/O."""

from __future__ import annotations

from tandem.placement.policy import blocks_needed, rank_decode, rank_prefill
from tandem.placement.worker_view import Role, WorkerView


def _d(
    name: str, free: int = 100, blocks: int = 100, running: int = 0, active: int = 0
) -> WorkerView:
    return WorkerView(
        name,
        Role.DECODE,
        num_running=running,
        num_free_blocks=free,
        num_blocks=blocks,
        active=active,
    )


def _p(name: str, waiting: int = 0, active: int = 0) -> WorkerView:
    return WorkerView(name, Role.PREFILL, num_waiting=waiting, active=active)


def test_blocks_needed_rounds_up() -> None:
    assert [blocks_needed(n, 16) for n in (1, 16, 17, 32)] == [1, 1, 2, 2]


def test_decode_prefers_idle_then_free_blocks() -> None:
    ranked = rank_decode([_d("a", running=3), _d("b", free=50), _d("c", free=80)], 16, 16)
    assert [w.endpoint for w in ranked] == ["c", "b", "a"]


def test_decode_router_count_beats_stale_stats() -> None:
    ranked = rank_decode([_d("a", active=2), _d("b", running=1)], 16, 16)
    assert [w.endpoint for w in ranked] == ["b", "a"]


def test_decode_without_room_goes_last_and_unknown_capacity_fits() -> None:
    ranked = rank_decode(
        [_d("full", free=1), _d("new", free=0, blocks=0), _d("ok", free=5)], 64, 16
    )
    assert [w.endpoint for w in ranked] == ["ok", "new", "full"]


def test_decode_excludes() -> None:
    assert [w.endpoint for w in rank_decode([_d("a"), _d("b")], 1, 16, {"a"})] == ["b"]


def test_prefill_least_loaded_without_affinity() -> None:
    ranked = rank_prefill([_p("a", waiting=2), _p("b"), _p("c", active=1)], [], 8)
    assert [w.endpoint for w in ranked] == ["b", "c", "a"]


def test_prefill_sticks_to_prefix_owner() -> None:
    ranked = rank_prefill([_p("a"), _p("b", waiting=3)], [("b", 2)], 8)
    assert [w.endpoint for w in ranked] == ["b", "a"]


def test_prefill_affinity_lost_when_queue_too_deep() -> None:
    ranked = rank_prefill([_p("a"), _p("b", waiting=9)], [("b", 2)], 8)
    assert [w.endpoint for w in ranked] == ["a", "b"]


def test_prefill_longest_owner_first_then_shorter() -> None:
    workers = [_p("a"), _p("b", waiting=20), _p("c", waiting=1)]
    ranked = rank_prefill(workers, [("b", 3), ("c", 1)], 8)
    assert [w.endpoint for w in ranked] == ["c", "a", "b"]


def test_prefill_owner_not_in_pool_is_ignored() -> None:
    assert [w.endpoint for w in rank_prefill([_p("a")], [("gone", 4)], 8)] == ["a"]


def test_decode_prefers_the_prefix_holder() -> None:
    """The worker holding the longest cached prefix wins over a less busy one."""
    ranked = rank_decode([_d("a"), _d("b", running=2), _d("c", running=1)], 64, 16,
                         matched={"b": 3, "c": 1})
    assert [w.endpoint for w in ranked] == ["b", "a", "c"]


def test_decode_prefix_holder_loses_when_overloaded_or_full() -> None:
    busy = rank_decode([_d("a"), _d("b", running=5)], 64, 16, matched={"b": 3}, slack=4)
    assert [w.endpoint for w in busy] == ["a", "b"]  # 5 deeper than a's 0: overloaded
    full = rank_decode([_d("a"), _d("b", free=2)], 96, 16, matched={"b": 3})
    assert [w.endpoint for w in full] == ["a", "b"]  # 6 blocks needed, 3 held + 2 free


def test_decode_prefix_held_blocks_count_as_room() -> None:
    """Blocks the holder already caches need no new ones: 4 needed, 2 held, 2 free fits."""
    ranked = rank_decode([_d("a"), _d("b", free=2)], 64, 16, matched={"b": 2})
    assert [w.endpoint for w in ranked] == ["b", "a"]
