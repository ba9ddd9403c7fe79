"""The prefill role's metrics: the worker set plus what only a pusher knows.

Nothing below the prefill worker counts the bytes it sends (the sender moves them, the decode
side's receiver counts what it got), so pushes are counted here as they end.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tandem.common.obs.metrics_export import COMPAT_VLLM
from tandem.worker.metrics import WorkerMetrics


class PrefillMetrics(WorkerMetrics):
    """``WorkerMetrics`` for role "prefill", plus bytes pushed and failed pushes."""

    def __init__(
        self, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic, *,
        model_name: str = "", compat: str = COMPAT_VLLM,
    ) -> None:
        super().__init__("prefill", window_s, clock, model_name=model_name, compat=compat)
        self.bytes_pushed = 0
        self.failed_pushes = 0

    def push_ended(self, nbytes: int, committed: bool) -> None:
        """A push that moved ``nbytes`` ended (committed or failed)."""
        self.bytes_pushed += nbytes
        if not committed:
            self.failed_pushes += 1
