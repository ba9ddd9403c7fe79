"""One live move of a request's decode leg, the router's side of it (the worker's:
tandem/worker/decode/stream_moves.py).

    the leg's Decode stream ended Suspended ──> reserve a target (the tokens but the last)
        ──> MoveOut(source -> target) ──> moved: the source freed it; read on from the target
        | no target took it (none healthy, all full): Resume on the source
        | the push failed at the target (Fault.RECEIVER): the source resumed it already
        | MoveOut failed otherwise: Resume on the source
        | the source itself gone: LegLostError (the request's re-prefill migration takes over)

Every outcome settles the move's ticket (tandem/router/handoff/live_moves.py) and counts in
the live-migration metrics by cause and outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from tandem.common.obs import tracing
from tandem.router.errors import (
    Fault,
    LegLostError,
    NoWorkerError,
    OverloadedError,
    WorkerCallError,
)
from tandem.router.handoff import blame, legs
from tandem.router.handoff.deadline import Deadline
from tandem.router.handoff.deps import HandoffDeps
from tandem.router.handoff.leg_types import DecodeLeg
from tandem.router.handoff.live_moves import MoveCause, MoveOutcome, MoveTicket
from tandem.router.handoff.open_legs import OpenLegs

log = logging.getLogger(__name__)


class LegMove:
    """The live moves of one request's decode legs (see the module docstring)."""

    def __init__(self, deps: HandoffDeps, calls: legs.LegCalls, open_legs: OpenLegs,
                 request_id: str, deadline: Deadline, span: tracing.Span) -> None:
        self._deps = deps
        self._calls = calls
        self._open = open_legs
        self._request_id = request_id
        self._deadline = deadline
        self._span = span

    async def move(self, src: DecodeLeg, ticket: MoveTicket,
                   reserve: Callable[[], Awaitable[DecodeLeg]], last_token: int,
                   shared: bool = False) -> DecodeLeg | None:
        """Move the suspended ``src`` to the leg ``reserve`` makes, committing ``last_token``
        there; that leg, or None when the stream stays on ``src`` (resumed; the ticket says
        why). Raises LegLostError when the source is gone meanwhile. ``shared``: ``src`` is
        a forked request's shared leg, which stays open for its other sequences."""
        deps = self._deps
        cause = (ticket.cause or MoveCause.DRAIN).value
        try:
            target = await reserve()
        except (NoWorkerError, OverloadedError) as err:
            await self.resume(src, ticket, f"no decode worker could take it: {err}")
            return None
        try:
            moved, _ = await legs.move_out(self._calls, src.endpoint, src.leg_id,
                                           target.reservation, last_token,
                                           self._deadline.remaining(), self._span, src.index)
        except WorkerCallError as err:
            await self._open.close(target.endpoint, target.leg_id)
            legs.raise_if_fatal(err)
            if err.fault is Fault.RECEIVER:  # the target failed: the source resumed it
                deps.counters.live_moves[(cause, "stayed")] += 1
                ticket.settle(MoveOutcome(False, f"the push failed: {err.details}"))
                return None
            if err.code_name in legs.WORKER_GONE:
                raise LegLostError(src.endpoint, str(err),
                                   down=blame.takes_out_of_pool(err)) from err
            await self.resume(src, ticket, str(err))
            return None
        if not shared:
            self._open.done(src.endpoint, src.leg_id, True)  # freed there once committed
            deps.registry.release(src.endpoint)
        deps.registry.acquire(target.endpoint)
        deps.live.rehome(ticket, target.endpoint, target.leg_id)
        deps.counters.live_moves[(cause, "moved")] += 1
        deps.counters.moved_bytes += moved
        log.info("request %s: moved live from %s to %s (%d bytes of KV)",
                 self._request_id, src.endpoint, target.endpoint, moved)
        ticket.settle(MoveOutcome(True, bytes=moved))
        return target

    async def resume(self, leg: DecodeLeg, ticket: MoveTicket, why: str) -> None:
        """A suspended leg runs on where it is (its next Decode call reads on). Raises
        LegLostError when it cannot."""
        try:
            resumed = await legs.resume(self._calls, leg.endpoint, leg.leg_id, leg.index,
                                        self._span)
        except WorkerCallError as err:
            legs.raise_if_fatal(err)
            raise LegLostError(leg.endpoint, f"could not resume it: {err}",
                               down=blame.takes_out_of_pool(err)) from err
        if not resumed:
            raise LegLostError(leg.endpoint, "it ended while moving")
        cause = (ticket.cause or MoveCause.DRAIN).value
        self._deps.counters.live_moves[(cause, "stayed")] += 1
        log.info("request %s: stays on %s: %s", self._request_id, leg.endpoint, why)
        ticket.settle(MoveOutcome(False, why))
