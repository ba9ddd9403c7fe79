"""Live moves of decode streams between decode workers (docs/design.md section 2).

Every decode stream in flight has a ``MoveTicket`` in ``LiveStreams``, filed under the worker
it is on (each sequence of a forked request has its own: they move one at a time, the
prompt's blocks pushed with the first, the others' reservations finding them cached on the
target, tandem/router/handoff/ledger.py). Moving the streams off a worker (an operator's drain with
--migrate)::

    move_all(endpoint) ──> per ticket: ticket.ask(cause); its pre-copy while the stream
        decodes on (``ticket.prepare``, the request's handoff: tandem/router/handoff/
        leg_precopy.py; failed: it stays, the reason); Suspend(D1, leg)
        | Suspend refused (finished, not decoding yet, forked ...): it stays (the reason)
        └─> D1 ends the leg's Decode stream after every token so far (LegSuspendedError);
            the request's handoff (ledger.py) then, at that token boundary:
              Reserve(D2, tokens but the last, moved_in) ──> MoveOut(D1 -> D2: the blocks D2
              lacks, COMMIT of the last token) ──> Decode(D2) reads on; D1 freed it
              | no D2, or the push failed (D2 died ...): D1 resumes it, Decode(D1) reads on
              | D1 itself gone: the leg is lost, the re-prefill migration takes over
            and settles the ticket (moved, or why it stayed)

The client's stream sees the next token from D2 after the last one from D1: nothing lost,
repeated or changed (the continuation: tokens, the seeded generator's draws, penalties, stop
strings and grammar replayed from them on D2, tandem/engine/kv_connector/migrate_side.py).
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tandem.router.errors import WorkerCallError
from tandem.router.handoff import legs


class MoveCause(enum.Enum):
    """Why a stream moved (the metrics' label)."""

    DRAIN = "drain"  # an operator drained its worker with --migrate
    OPERATOR = "operator"  # an operator moved a worker's streams (RouterAdmin.MoveStreams)
    FLIP = "flip"  # its decode worker flips to prefill (RouterAdmin.FlipWorker)


@dataclass(frozen=True, slots=True)
class MoveOutcome:
    """How one asked-for move ended: moved (``bytes`` of KV pushed), or stayed (``reason``)."""

    moved: bool
    reason: str = ""
    bytes: int = 0


class MoveTicket:
    """One decode stream in flight, as a move sees it: where it is, and whether a move of it
    was asked for (its handoff settles the outcome)."""

    def __init__(self, endpoint: str, leg_id: str, index: int = 0) -> None:
        self.endpoint = endpoint
        self.leg_id = leg_id
        self.index = index  # the sequence of a forked leg
        self.cause: MoveCause | None = None
        self.asked_at = 0.0
        # before the Suspend, while the stream decodes on: the request's pre-copy; False
        # when the stream stays (it settled the ticket)
        self.prepare: Callable[[], Awaitable[bool]] | None = None
        self._outcome: asyncio.Future[MoveOutcome] | None = None

    def ask(self, cause: MoveCause) -> tuple[asyncio.Future[MoveOutcome], bool]:
        """Mark a move asked for: the future the handoff settles, and whether this ask is
        the first (a move already asked for and not settled is the one answered)."""
        if self._outcome is not None and not self._outcome.done():
            return self._outcome, False
        self.cause, self.asked_at = cause, time.monotonic()
        self._outcome = asyncio.get_running_loop().create_future()
        return self._outcome, True

    def settle(self, outcome: MoveOutcome) -> None:
        """The asked-for move ended (no-op when none was asked for or it is settled)."""
        if self._outcome is not None and not self._outcome.done():
            self._outcome.set_result(outcome)
        self._outcome = None


class LiveStreams:
    """Every ticket, by the decode worker its stream is on (one event loop)."""

    def __init__(self) -> None:
        self._by_endpoint: dict[str, set[MoveTicket]] = {}
        self._soon: set[asyncio.Task[MoveOutcome]] = set()
        self._causes: dict[str, MoveCause] = {}  # why streams move off an endpoint now

    def moving_off(self, endpoint: str, cause: MoveCause) -> None:
        """Streams move off ``endpoint`` for ``cause`` (what ``cause_of`` says of it until
        it is asked again)."""
        self._causes[endpoint] = cause

    def cause_of(self, endpoint: str) -> MoveCause:
        """Why streams move off ``endpoint`` (a drain unless said otherwise)."""
        return self._causes.get(endpoint, MoveCause.DRAIN)

    @contextmanager
    def open(self, endpoint: str, leg_id: str, index: int = 0) -> Iterator[MoveTicket]:
        """A ticket for the stream of ``leg_id`` (its sequence ``index``) on ``endpoint``
        while the block runs; an asked-for move still open when it ends is settled as not
        moved (the request ended)."""
        ticket = MoveTicket(endpoint, leg_id, index)
        self._by_endpoint.setdefault(endpoint, set()).add(ticket)
        try:
            yield ticket
        finally:
            self._drop(ticket)
            ticket.settle(MoveOutcome(False, "the request ended first"))

    def rehome(self, ticket: MoveTicket, endpoint: str, leg_id: str) -> None:
        """The stream moved to ``leg_id`` on ``endpoint`` (a single-sequence leg)."""
        self._drop(ticket)
        ticket.endpoint, ticket.leg_id, ticket.index = endpoint, leg_id, 0
        self._by_endpoint.setdefault(endpoint, set()).add(ticket)

    def move_soon(self, calls: legs.LegCalls, ticket: MoveTicket, cause: MoveCause) -> None:
        """Move ``ticket``'s stream as soon as it decodes (it started on a worker being
        drained with migrate after the drain's moves were asked for)."""
        task = asyncio.get_running_loop().create_task(_move(calls, ticket, cause))
        self._soon.add(task)
        task.add_done_callback(self._soon.discard)

    def on(self, endpoint: str) -> list[MoveTicket]:
        """The streams on ``endpoint`` now."""
        return list(self._by_endpoint.get(endpoint, ()))

    def _drop(self, ticket: MoveTicket) -> None:
        tickets = self._by_endpoint.get(ticket.endpoint)
        if tickets is not None:
            tickets.discard(ticket)
            if not tickets:
                del self._by_endpoint[ticket.endpoint]


async def move_all(live: LiveStreams, calls: legs.LegCalls, endpoint: str,
                   cause: MoveCause) -> list[MoveOutcome]:
    """Move every stream on ``endpoint`` elsewhere, at once; each one's outcome."""
    tickets = live.on(endpoint)
    return list(await asyncio.gather(*(_move(calls, t, cause) for t in tickets)))


async def _move(calls: legs.LegCalls, ticket: MoveTicket, cause: MoveCause) -> MoveOutcome:
    outcome, first = ticket.ask(cause)
    if first and (ticket.prepare is None or await ticket.prepare()):
        try:
            await legs.suspend(calls, ticket.endpoint, ticket.leg_id, ticket.index)
        except WorkerCallError as err:
            ticket.settle(MoveOutcome(False, f"{err.code_name}: {err.details}"))
    return await outcome
