"""A live move's pre-copy, the router's side of it (the worker's: tandem/worker/decode/
moves.py), as live VM migration does it: most of the KV crosses while the stream decodes on,
so the stream stops only for the rest.

    a move asked for ──> the stream's leading full blocks (those of every token the client
        has but the last, whole blocks: never written again on the source)
        ──> Reserve(target, those tokens, precopy): held there once committed, nothing runs
        ──> PreCopy(source -> target): pushed and committed while the source decodes on
        ──> then the move itself (tandem/router/handoff/leg_move.py): Suspend; its Reserve
            goes to that target first, finds those blocks cached there (its prefix-delta),
            so MoveOut pushes only the tail (the partial last block and any filled since)
        ──> the pre-copy's leg is aborted once the move is over (its blocks stay referenced
            by the move's reservation) or the stream ends first
        | fewer than ``live_move_precopy_blocks`` full blocks (or 0: off): no pre-copy
        | no target took its Reserve (none with a prefix cache, none with room): the move
          goes on without it
        | the push failed at the target (it died, refused, left the pool): the stream stays
          on its source, never stopped (the ticket says why)
        | the source refused it (the blocks are not all held there: a sliding window; the
          stream ending): the move goes on without it

The target holds a committed pre-copy at most for its lease (``lease_s`` from its Reserve),
whatever the router does; the source pins the blocks it pushes for the push only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tandem.common.obs import tracing
from tandem.router.api.sampling import LogprobOptions, SamplingSpec
from tandem.router.errors import (
    Fault,
    RouterError,
    WorkerCallError,
)
from tandem.router.handoff import legs
from tandem.router.handoff.deadline import Deadline
from tandem.router.handoff.deps import HandoffDeps
from tandem.router.handoff.leg_types import DecodeLeg, LegRequest
from tandem.router.handoff.live_moves import MoveCause, MoveOutcome, MoveTicket
from tandem.router.handoff.open_legs import OpenLegs

log = logging.getLogger(__name__)

# A pre-copy's reservation runs nothing: one greedy token, so a long request's max_tokens
# never counts against the target's context limit for it.
PRECOPY_SAMPLING = SamplingSpec(max_tokens=1, temperature=0.0)


@dataclass(frozen=True, slots=True)
class PreCopied:
    """A pre-copy held on ``endpoint`` under ``leg_id``: the KV of the stream's first
    ``tokens`` tokens (``bytes`` pushed)."""

    endpoint: str
    leg_id: str
    tokens: int
    bytes: int


@dataclass(frozen=True, slots=True)
class PreCopyOutcome:
    """Whether the move goes on (False: the stream stays, its ticket settled), and the
    pre-copy it goes on with (None: none was made)."""

    go: bool
    precopied: PreCopied | None = None


def precopy_leg(leg_id: str, tokens: list[int], lora: str) -> LegRequest:
    """The pre-copy reservation's request: ``tokens`` (whole blocks), nothing to sample."""
    return LegRequest(leg_id, tokens, PRECOPY_SAMPLING, LogprobOptions(), lora=lora,
                      precopy=True)


class LegPreCopy:
    """The pre-copies of one request's decode legs, and the one its next move goes with
    (see the module docstring)."""

    def __init__(self, deps: HandoffDeps, calls: legs.LegCalls, open_legs: OpenLegs,
                 request_id: str, deadline: Deadline, span: tracing.Span) -> None:
        self._deps = deps
        self._calls = calls
        self._open = open_legs
        self._request_id = request_id
        self._deadline = deadline
        self._span = span
        self._held: PreCopied | None = None  # the pre-copy the next move goes with
        self._releases: set[asyncio.Task[None]] = set()  # pre-copies being freed

    async def prepare(self, leg: Callable[[], DecodeLeg], tokens: list[int],
                      ticket: MoveTicket, streaming: Callable[[], bool],
                      reserve: Callable[[list[int], str], Awaitable[DecodeLeg]]) -> bool:
        """A move of the stream on ``leg()`` was asked for, its client having ``tokens``:
        ``run``, with ``reserve(tokens, source endpoint)`` making the pre-copy's leg
        elsewhere; the pre-copy is kept for the move (``take``) while ``streaming()`` and the
        stream is still on that leg (else it ended or moved meanwhile: freed at once). False
        when the stream stays (the ticket settled)."""
        src = leg()
        try:
            outcome = await self.run(src, tokens, ticket,
                                     lambda lead: reserve(lead, src.endpoint))
        except RouterError as exc:  # a refused or failed pre-copy Reserve: move without it
            log.info("request %s: no pre-copy: %s", self._request_id, exc)
            return True
        pre = outcome.precopied
        if pre is not None:
            if streaming() and leg() is src:
                self.release_soon(self._held)  # an earlier pre-copy no move took
                self._held = pre
            else:
                await self.release(pre)
        return outcome.go

    def take(self) -> PreCopied | None:
        """The pre-copy the move now under way goes with (None: none); no longer kept."""
        pre, self._held = self._held, None
        return pre

    @staticmethod
    def first(ranked: list[str], pre: PreCopied | None) -> list[str]:
        """``ranked`` decode workers with the pre-copy's target first (it holds the blocks)
        when it is among them."""
        if pre is None or pre.endpoint not in ranked:
            return ranked
        return [pre.endpoint, *(e for e in ranked if e != pre.endpoint)]

    def release_soon(self, pre: PreCopied | None) -> None:
        """Free ``pre`` on its target without waiting (the move's reservation references its
        blocks by now, or the move failed)."""
        if pre is None:
            return
        task = asyncio.get_running_loop().create_task(self.release(pre))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def drop(self, ticket: MoveTicket) -> None:
        """The stream ended: no more pre-copies for its ``ticket``; free the one no move
        took (if any)."""
        ticket.prepare = None
        pre = self.take()
        if pre is not None:
            await self.release(pre)

    def tokens(self, src: DecodeLeg, tokens: list[int]) -> int:
        """How many leading ``tokens`` (the prompt and every token the client has) a
        pre-copy from ``src`` carries: whole blocks of all but the last (whose KV the source
        computes in its next step), 0 when fewer than the configured blocks."""
        layout = src.reservation.layout
        bs = layout.block_size if layout is not None else self._deps.config.block_size
        blocks = (len(tokens) - 1) // bs
        least = self._deps.config.live_move_precopy_blocks
        return blocks * bs if least > 0 and blocks >= least else 0

    async def run(self, src: DecodeLeg, tokens: list[int], ticket: MoveTicket,
                  reserve: Callable[[list[int]], Awaitable[DecodeLeg]]) -> PreCopyOutcome:
        """Pre-copy the stream on ``src`` whose client has ``tokens`` (prompt included) to
        the leg ``reserve`` makes for a pre-copy of the leading tokens it is given
        (``precopy_leg``). A failure settles ``ticket``: the stream stays, untouched."""
        n = self.tokens(src, tokens)
        if n == 0:
            return PreCopyOutcome(True)
        cause = (ticket.cause or MoveCause.DRAIN).value
        try:
            target = await reserve(tokens[:n])
        except RouterError as err:  # none took it (no caching there, full): the move goes on
            log.info("request %s: no decode worker took its pre-copy: %s", self._request_id,
                     err)
            return PreCopyOutcome(True)
        try:
            pushed, _ = await legs.precopy(self._calls, src.endpoint, src.leg_id, target,
                                           tokens[:n], self._deadline.remaining(), self._span,
                                           src.index)
        except WorkerCallError as err:
            await self.release(PreCopied(target.endpoint, target.leg_id, n, 0))
            if err.fault is Fault.RECEIVER:  # the target failed, refused or left the pool
                return self.stay(ticket, cause, f"the pre-copy failed: {err.details}")
            # The source refused it (blocks it no longer holds behind a sliding window, the
            # stream ending): the move goes on without, and the Suspend says the rest.
            log.info("request %s: no pre-copy from %s: %s", self._request_id, src.endpoint,
                     err)
            return PreCopyOutcome(True)
        self._deps.counters.precopy_bytes += pushed
        log.info("request %s: pre-copied %d tokens (%d bytes of KV) from %s to %s",
                 self._request_id, n, pushed, src.endpoint, target.endpoint)
        return PreCopyOutcome(True, PreCopied(target.endpoint, target.leg_id, n, pushed))

    async def release(self, pre: PreCopied) -> None:
        """Free a pre-copy's blocks on its target (an Abort of its leg, unless the request's
        every leg was aborted already)."""
        await self._open.close_if_open(pre.endpoint, pre.leg_id)

    def stay(self, ticket: MoveTicket, cause: str, why: str) -> PreCopyOutcome:
        """The move ends before its Suspend: the stream stays, untouched (counted, the
        ticket settled with ``why``)."""
        self._deps.counters.live_moves[(cause, "stayed")] += 1
        log.info("request %s: stays where it is: %s", self._request_id, why)
        ticket.settle(MoveOutcome(False, why))
        return PreCopyOutcome(False)
