"""The router's load index: workers in the order the policies rank them, kept sorted.

``policy.rank_decode`` and ``policy.rank_prefill`` sort every worker per request; with
hundreds of workers that sort would cost more than the rest of a request's simulation. The
simulator keeps each pool sorted by the policies' own keys as loads change (bisect, O(log n)
per change) and hands the policies only the workers that can come first::

    decode   (queue depth, -free blocks, endpoint): the first worker with room for the
             request, plus the best prefix holder rank_decode could prefer to it (longest
             cached prefix, within ``slack`` of the least busy with room, then by the key)
    prefill  (queue depth, endpoint): the first cost_model.MAX_CANDIDATES, plus the prefix
             owner (rank_prefill's sticky choice)

so the real functions return the same first choices as over the whole pool (decide weighs
only the first MAX_CANDIDATES). Endpoints are zero-padded ("d00042"), so the integer index
orders ties as the endpoint strings do. ``simulate(..., full_rank=True)`` passes the whole
pool instead: the reference the tests compare against.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import Any

from tandem.planner.sim.decode import DecodeWorker
from tandem.planner.sim.request import SimRequest

# Holder sets up to this size are scanned directly; bigger ones (a system prompt cached
# everywhere) by walking the index from the least busy worker with room.
_SMALL_HOLDERS = 32


class LoadIndex:
    """Routable workers as sorted key tuples, the worker's integer index last."""

    __slots__ = ("keys",)

    def __init__(self) -> None:
        self.keys: list[tuple[int, ...]] = []

    def put(self, worker: Any, key: tuple[int, ...]) -> None:
        """Insert ``worker`` under ``key`` or move it there."""
        old = worker.key
        if old == key:
            return
        if old is not None:
            del self.keys[bisect_left(self.keys, old)]
        insort(self.keys, key)
        worker.key = key

    def drop(self, worker: Any) -> None:
        """Take ``worker`` out (it left the routable pool)."""
        if worker.key is not None:
            del self.keys[bisect_left(self.keys, worker.key)]
            worker.key = None


def decode_key(w: DecodeWorker) -> tuple[int, int, int]:
    """rank_decode's order among workers with room: least busy, most free blocks, endpoint."""
    return (len(w.requests), -w.blocks.free, w.index)


def decode_candidates(index: LoadIndex, workers: list[DecodeWorker],
                      holders: set[DecodeWorker] | None, req: SimRequest, slack: int
                      ) -> tuple[list[DecodeWorker], dict[str, int]]:
    """The decode workers rank_decode can put first for ``req`` and the prefix blocks each
    holds (its ``matched``); ([], {}) when none has room."""
    need, group = req.need_blocks, req.group
    cap = min(req.prefix, req.tokens - 1)
    keys = index.keys
    first: DecodeWorker | None = None
    first_i = first_m = 0
    for i, key in enumerate(keys):
        w = workers[key[2]]
        m = w.blocks.matched_blocks(group, cap) if holders and w in holders else 0
        if -key[1] >= need - m:
            first, first_i, first_m = w, i, m
            break
    if first is None:
        return [], {}
    matched = {first.endpoint: first_m} if first_m else {}
    if not holders:
        return [first], matched
    least = keys[first_i][0] + slack
    best: DecodeWorker | None = None
    best_m, best_key = 0, keys[first_i]
    if len(holders) <= _SMALL_HOLDERS:
        for w in holders:
            key = w.key
            if key is None or key[0] > least:
                continue
            m = w.blocks.matched_blocks(group, cap)
            if m <= 0 or -key[1] < need - m:
                continue
            if m > best_m or (m == best_m and key < best_key):
                best, best_m, best_key = w, m, key
    else:
        top = cap // first.block_size
        for j in range(first_i, len(keys)):
            key = keys[j]
            if key[0] > least:
                break
            w = workers[key[2]]
            if w not in holders:
                continue
            m = w.blocks.matched_blocks(group, cap)
            if m > best_m and -key[1] >= need - m:
                best, best_m = w, m
                if m >= top:
                    break  # nobody holds more; later keys lose the tie
    if best is None or best is first:
        return [first], matched
    matched[best.endpoint] = best_m
    return [first, best], matched


def all_decode(index: LoadIndex, workers: list[DecodeWorker], holders: set[DecodeWorker] | None,
               req: SimRequest) -> tuple[list[DecodeWorker], dict[str, int]]:
    """Every routable decode worker and the prefix blocks each holds (no shortcut)."""
    pool = [workers[key[2]] for key in index.keys]
    cap = min(req.prefix, req.tokens - 1)
    matched = {}
    for w in pool:
        if holders and w in holders:
            m = w.blocks.matched_blocks(req.group, cap)
            if m:
                matched[w.endpoint] = m
    return pool, matched


def all_prefill(index: LoadIndex, workers: list[Any]) -> list[Any]:
    """Every routable prefill worker, least loaded first (the router takes the first
    cost_model.MAX_CANDIDATES of these, plus the prefix owner, without this call)."""
    return [workers[key[1]] for key in index.keys]
