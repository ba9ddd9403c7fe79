"""Worker calls in flight, by endpoint, so the calls to a worker that left the pool are cut.

    legs.*  --with inflight.track(endpoint, call)-->  await call / call.read()
    health monitor: probe of endpoint fails  -->  inflight.cancel(endpoint, reason)
        every call tracked on endpoint is cancelled; its ``track`` block raises CallCutError
        (a worker failure: the ledger migrates, retries elsewhere or fails the request)

A partitioned worker answers nothing and closes nothing: without this, a call to it waits
for its deadline (or keepalive); with it, the first failed probe ends every call at once.
Cutting a call is not cancelling the request: a task that is itself being cancelled (its
client went away) still sees asyncio.CancelledError, never CallCutError.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from tandem.router.errors import RouterError


class CallCutError(RouterError):
    """A worker call the router cancelled because the worker left the pool."""

    def __init__(self, endpoint: str, reason: str) -> None:
        super().__init__(f"call to {endpoint} cut: {reason}")
        self.endpoint = endpoint
        self.reason = reason


class Cancellable(Protocol):
    """A gRPC aio call, as far as the tracker needs it."""

    def cancel(self) -> bool:
        """Cancel the call; False when it had already ended."""


@dataclass(eq=False, slots=True)
class _Tracked:
    call: Cancellable
    reason: str | None = None  # set when cut


class InflightCalls:
    """Every tracked worker call, grouped by the endpoint it went to (one event loop)."""

    def __init__(self) -> None:
        self._calls: dict[str, set[_Tracked]] = {}
        self.cut = 0  # calls cut so far (for tests and logs)

    def count(self, endpoint: str) -> int:
        """Calls in flight to ``endpoint``."""
        return len(self._calls.get(endpoint, ()))

    @contextmanager
    def track(self, endpoint: str, call: Cancellable) -> Iterator[None]:
        """Hold ``call`` on ``endpoint``'s list while the block runs; raises CallCutError
        when ``cancel(endpoint, ...)`` cut it (asyncio.CancelledError when the running task
        itself is being cancelled)."""
        entry = _Tracked(call)
        calls = self._calls.setdefault(endpoint, set())
        calls.add(entry)
        try:
            yield
        except asyncio.CancelledError as exc:
            if entry.reason is None or _being_cancelled():
                raise
            raise CallCutError(endpoint, entry.reason) from exc
        finally:
            calls.discard(entry)
            if not calls and self._calls.get(endpoint) is calls:
                del self._calls[endpoint]

    def cancel(self, endpoint: str, reason: str) -> int:
        """Cut every call in flight to ``endpoint``; returns how many were cut."""
        cut = 0
        for entry in list(self._calls.get(endpoint, ())):
            entry.reason = reason
            cut += bool(entry.call.cancel())  # False: it had just ended on its own
        self.cut += cut
        return cut


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
