"""The lease of a live move's pre-copy held on this decode worker (the move's target).

    Reserve(precopy) ──start(rid, lease)──> committed, its blocks held (prefix-cached, nothing
        runs: tandem/engine/core/remote_kv.py) until the router's Abort frees them
        ──> ``lease`` seconds after the Reserve, ``expire(rid)`` (an abort) whatever the
            router did; ``forget(rid)`` when the request's streams are gone first
        ──> ``expire_all()`` at a drain's start: a draining worker takes no move in, so what
            it holds for one is freed at once (not waited for by the drain)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class PreCopyLeases:
    """One timer per held pre-copy, by request id (one event loop)."""

    def __init__(self, expire: Callable[[str], object]) -> None:
        self._expire = expire
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def start(self, request_id: str, lease_s: float) -> None:
        """``expire(request_id)`` in ``lease_s`` seconds unless forgotten first."""
        self.forget(request_id)
        self._timers[request_id] = asyncio.get_running_loop().call_later(
            lease_s, self._expire, request_id)

    def forget(self, request_id: str) -> None:
        """The request is gone: no expiry for it (no-op when none is pending)."""
        timer = self._timers.pop(request_id, None)
        if timer is not None:
            timer.cancel()

    def expire_all(self) -> None:
        """``expire`` every held pre-copy now (a drain: no move will take them)."""
        for request_id, timer in list(self._timers.items()):
            timer.cancel()
            del self._timers[request_id]
            self._expire(request_id)
