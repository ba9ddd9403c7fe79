"""Which of a prompt's blocks each worker already holds: its own report, plus what this router
has put there since.

    worker report (WorkerStats.cached_block_hashes, every heartbeat: up to 2 s old)
  + recorded here (the prompt blocks of a Reserve this router just made, the blocks of a
    request that just finished there), kept ``keep_s``: until a report has caught up
  = what ``matched`` walks the prompt's hash chain (tandem/common/block_hash.py) against

A worker may evict a block at any time, so this is a routing hint only: the decode worker's
Reserve says what it really reused (ReserveResponse.cached_tokens), and the handoff trusts
that, never this. Recorded entries expire after ``keep_s``, so a worker that left (or was
replaced at the same address) loses them with its reports.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from tandem.placement.worker_view import WorkerView


class HeldBlocks:
    """Per endpoint, the block hashes this router recently placed there (bounded, LRU)."""

    def __init__(self, clock: Callable[[], float], keep_s: float, capacity: int = 65536) -> None:
        self._clock = clock
        self._keep_s = keep_s
        self._capacity = capacity
        self._recent: dict[str, OrderedDict[int, float]] = {}

    def record(self, endpoint: str, hashes: Sequence[int]) -> None:
        """``endpoint`` holds (or is about to hold) the blocks named by ``hashes``."""
        recent = self._recent.setdefault(endpoint, OrderedDict())
        now = self._clock()
        for h in hashes:
            recent[h] = now
            recent.move_to_end(h)
        while len(recent) > self._capacity:
            recent.popitem(last=False)

    def matched(self, worker: WorkerView, hashes: Sequence[int]) -> int:
        """How many leading blocks of the chain ``hashes`` ``worker`` is believed to hold."""
        reported = worker.cached_blocks
        recent = self._recent.get(worker.endpoint)
        oldest = self._clock() - self._keep_s
        n = 0
        for h in hashes:
            if h in reported:
                n += 1
                continue
            when = recent.get(h) if recent is not None else None
            if when is None or when < oldest:
                break
            n += 1
        return n
