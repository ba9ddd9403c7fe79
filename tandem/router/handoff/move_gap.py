"""The client-visible gap of a live move, in seconds and in the source's decode steps.

    tokens from the source ──> tick(n) each: their spacing, the last ``WINDOW`` tokens kept
    the stream suspended, moved ──> moved(): the gap starts at the last token's arrival
    first chunk from the target ──> tick(n): gap = now - that arrival; steps = gap / the
        mean spacing of the source's last tokens (its recent decode step, as this stream
        saw it: one token a step)

A move whose stream stayed (resumed on its source) measures nothing.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from tandem.router.handoff.counters import HandoffCounters

WINDOW = 16  # tokens whose spacing makes the recent step time


class MoveGap:
    """One stream's clock for its live moves' gaps (see the module docstring)."""

    def __init__(self, counters: HandoffCounters,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._counters = counters
        self._clock = clock
        self._last_at = clock()  # the latest token's arrival
        self._spacings: deque[float] = deque(maxlen=WINDOW)
        self._moving = False  # moved: the next chunk is the target's first

    def tick(self, tokens: int) -> bool:
        """A chunk of ``tokens`` arrived; True when it is the first after a move."""
        now = self._clock()
        first, self._moving = self._moving, False
        if first:
            gap = now - self._last_at
            self._counters.move_gap.observe(gap)
            if self._spacings:
                step = sum(self._spacings) / len(self._spacings)
                self._counters.move_gap_steps.observe(gap / step if step > 0 else 0.0)
            self._spacings.clear()  # the target's steps are another worker's
        elif tokens:
            self._spacings.extend([(now - self._last_at) / tokens] * min(tokens, WINDOW))
        self._last_at = now
        return first

    def moved(self) -> None:
        """The stream moved: its next chunk comes from the target."""
        self._moving = True
