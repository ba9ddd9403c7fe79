"""The legs one request holds open on workers, closed on every path; and what a failed call
or a lost leg says about its worker.

    Reserve on D          ──> add(D, leg, decode=True)       closed by the stream's end, a
    Prefill on P          ──> add(P, leg, decode=False)      renewal, a migration, or
                                                             abort_all when the request ends
                                                             abnormally (client gone, deadline,
                                                             error): an Abort to each worker
    a failed call / lost leg ──> logged with its worker's address (which the client's error
        does not name); the worker leaves the pool only when the failure says it is gone
        (tandem/router/handoff/blame.py)
"""

from __future__ import annotations

import logging

from tandem.common.obs import tracing
from tandem.router.errors import LegLostError, WorkerCallError
from tandem.router.handoff import blame, legs
from tandem.router.handoff.counters import HandoffCounters
from tandem.router.membership.registry import Registry

log = logging.getLogger(__name__)

OpenLeg = tuple[str, str, bool]  # (endpoint, leg id, is decode)


class OpenLegs:
    """One request's open legs and their Aborts (see the module docstring)."""

    def __init__(self, request_id: str, calls: legs.LegCalls, registry: Registry,
                 counters: HandoffCounters, span: tracing.Span) -> None:
        self._request_id = request_id
        self._calls = calls
        self._registry = registry
        self._counters = counters
        self._span = span
        self._open: list[OpenLeg] = []

    def add(self, endpoint: str, leg_id: str, decode: bool) -> None:
        """A leg now open on ``endpoint`` (it gets an Abort unless closed first)."""
        self._open.append((endpoint, leg_id, decode))

    def done(self, endpoint: str, leg_id: str, decode: bool) -> None:
        """A leg that ended on its own (nothing to abort)."""
        self._open.remove((endpoint, leg_id, decode))

    async def close(self, endpoint: str, leg_id: str) -> None:
        """Abort one open decode leg."""
        self._open.remove((endpoint, leg_id, True))
        await self.abort(endpoint, leg_id, decode=True)

    async def close_if_open(self, endpoint: str, leg_id: str) -> None:
        """Abort one decode leg unless it is closed already (``abort_all`` took it)."""
        if (endpoint, leg_id, True) in self._open:
            await self.close(endpoint, leg_id)

    async def close_decode_legs(self, endpoint: str) -> None:
        """Abort every decode leg still open on ``endpoint`` (a lost one, whichever of its
        reservations it got to)."""
        for key in [k for k in self._open if k[0] == endpoint and k[2]]:
            self._open.remove(key)
            await self.abort(endpoint, key[1], decode=True)

    async def abort(self, endpoint: str, leg_id: str, decode: bool,
                    index: int | None = None) -> None:
        """Tell a worker to drop ``leg_id`` (``index``: one sequence of a forked leg)."""
        self._counters.aborts_sent += 1
        await legs.abort(self._calls, endpoint, leg_id, decode, index, self._span)

    async def abort_all(self) -> None:
        """Tell every worker still holding a leg of this request to drop it."""
        open_legs, self._open = self._open, []
        for endpoint, leg_id, decode in open_legs:
            await self.abort(endpoint, leg_id, decode)

    def call_failed(self, err: WorkerCallError) -> None:
        """Log a failed call (with its worker's address, which the client's error does not
        name); the worker leaves the pool only when the failure says it is gone
        (tandem/router/handoff/blame.py)."""
        if blame.takes_out_of_pool(err):
            self.mark_down(err.endpoint, str(err))
        else:
            log.info("request %s: %s on %s failed, trying elsewhere: %s",
                     self._request_id, err.method, err.endpoint, err)

    def leg_lost(self, lost: LegLostError) -> None:
        """Log a lost decode leg; its worker leaves the pool only when the loss says it is
        gone (the channel failed, or the health monitor cut it)."""
        if lost.down:
            self.mark_down(lost.endpoint, lost.reason)
        else:
            log.warning("request %s: decode leg on %s lost, moving it: %s",
                        self._request_id, lost.endpoint, lost.reason)

    def mark_down(self, endpoint: str, why: str) -> None:
        """Take a failing worker out of the pool until a health probe passes again."""
        if self._registry.set_healthy(endpoint, False):
            log.warning("worker %s left the pool: %s", endpoint, why)
