"""HeldBlocks: a worker's reported prefix blocks plus what this router just put there."""

from __future__ import annotations

from tandem.placement.worker_view import Role, WorkerView
from tandem.router.handoff.held_blocks import HeldBlocks


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _w(name: str, reported: tuple[int, ...] = ()) -> WorkerView:
    return WorkerView(name, Role.DECODE, cached_blocks=frozenset(reported))


def test_matches_the_leading_run_of_reported_blocks() -> None:
    held = HeldBlocks(_Clock(), keep_s=5.0)
    assert held.matched(_w("a", (1, 2, 4)), [1, 2, 3, 4]) == 2  # a chain: stops at the gap
    assert held.matched(_w("a"), [1, 2]) == 0


def test_recorded_blocks_count_until_reports_catch_up() -> None:
    clock = _Clock()
    held = HeldBlocks(clock, keep_s=5.0)
    held.record("a", [1, 2, 3])
    assert held.matched(_w("a", (1,)), [1, 2, 3, 9]) == 3  # reported 1, recorded 2 and 3
    assert held.matched(_w("b"), [1, 2, 3]) == 0  # recorded for a only
    clock.now += 5.1
    assert held.matched(_w("a", (1,)), [1, 2, 3]) == 1  # expired: only the report counts


def test_recording_is_bounded() -> None:
    held = HeldBlocks(_Clock(), keep_s=5.0, capacity=3)
    held.record("a", [1, 2, 3, 4, 5])
    assert held.matched(_w("a"), [3, 4, 5]) == 3 and held.matched(_w("a"), [1]) == 0
