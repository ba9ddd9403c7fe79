"""Figures over a recent time window, for the Stats RPC (``tandem top``): latency percentiles
and a byte rate. Prometheus histograms are cumulative since start; an operator's live view
wants "the last minute" instead, so the worker also keeps the raw samples of that minute.

    add(v) at t ──> deque[(t, v)] ──prune: t < now - window_s, or over max_samples──> gone

Pure Python with an injected clock (tested without sleeping). Shared by both worker roles.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


class RecentWindow:
    """Samples of the last ``window_s`` seconds (at most ``max_samples`` of them)."""

    def __init__(
        self,
        window_s: float = 60.0,
        max_samples: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window_s <= 0 or max_samples < 1:
            raise ValueError("window_s must be > 0 and max_samples >= 1")
        self.window_s = window_s
        self._clock = clock
        self._samples: deque[tuple[float, float]] = deque(maxlen=max_samples)

    def add(self, value: float) -> None:
        """Record one sample now."""
        self._samples.append((self._clock(), value))

    def values(self) -> list[float]:
        """The samples still inside the window, oldest first."""
        cutoff = self._clock() - self.window_s
        while self._samples and self._samples[0][0] < cutoff:
            self._samples.popleft()
        return [v for _, v in self._samples]

    def percentile(self, q: float) -> float:
        """The nearest-rank ``q``-th percentile (0 < q <= 100) of the window; 0.0 when empty."""
        values = sorted(self.values())
        if not values:
            return 0.0
        rank = max(1, math.ceil(q / 100.0 * len(values)))
        return values[min(rank, len(values)) - 1]

    def rate(self) -> float:
        """Sum of the window's samples per second of window (e.g. bytes per second)."""
        return sum(self.values()) / self.window_s


@dataclass(frozen=True, slots=True)
class RecentFigures:
    """What the Stats RPC reports of the recent window (seconds, and bytes per second)."""

    ttft_p50_s: float = 0.0
    ttft_p90_s: float = 0.0
    itl_p50_s: float = 0.0
    itl_p90_s: float = 0.0
    kv_transfer_bytes_per_s: float = 0.0
