"""The simulator's clock: a heap of (time, sequence, handler, a, b) events.

Every event is a plain tuple and a handler called as ``handler(a, b)``, so the hot path
allocates no objects beyond the tuple; arrivals, already sorted, are merged in from a list
instead of going through the heap. Equal times run in the order they were pushed
(the sequence number), which makes a run a pure function of its inputs. A handler that
may have been superseded (a worker's rescheduled step end) carries a version in ``b`` and
ignores itself when the version is stale: nothing is ever removed from the heap.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Any

Handler = Callable[[Any, Any], None]


class EventQueue:
    """Future events in time order; ``now`` is the time of the one being handled."""

    __slots__ = ("_heap", "_seq", "now", "handled")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Handler, Any, Any]] = []
        self._seq = 0
        self.now = 0.0
        self.handled = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, at_s: float, handler: Handler, a: Any = None, b: Any = None) -> None:
        """Run ``handler(a, b)`` at ``at_s`` (never before ``now``)."""
        self._seq += 1
        heapq.heappush(self._heap, (at_s if at_s > self.now else self.now, self._seq,
                                    handler, a, b))

    def run(self, feed: Sequence[float] = (), on_feed: Callable[[int], None] | None = None
            ) -> None:
        """Handle events until none is left. ``feed``: sorted times merged in without the
        heap, ``on_feed(i)`` handling the i-th (after heap events of the same time)."""
        heap, pop = self._heap, heapq.heappop
        fed = on_feed or (lambda i: None)
        handled, i, n = 0, 0, len(feed) if on_feed is not None else 0
        while True:
            if i < n and (not heap or feed[i] < heap[0][0]):
                self.now = feed[i]
                fed(i)
                i += 1
            elif heap:
                at_s, _, handler, a, b = pop(heap)
                self.now = at_s
                handler(a, b)
            else:
                break
            handled += 1
        self.handled += handled
