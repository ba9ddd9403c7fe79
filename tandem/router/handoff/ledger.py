"""The handoff of one request across a decode worker and a prefill worker.

One leg at a time, normally just one::

    Reserve on D  ->  Prefill on P (push KV to D, commit)  ->  first token  ->  Decode(D) stream
    | D: the decode worker holding the longest cached prefix of the prompt unless it is
    |    overloaded (policy.rank_decode); its Reserve reuses those blocks, and the push
    |    carries only the blocks after them (PrefillRequest.skip_tokens)
                      | P fails: fresh reservation on D, next P; then PrefillLocal on D
                      | P's push fails because D died, was drained or cannot be reached (P
                      |    says so: blame.py): the leg is lost before its first token, as below
                      | placement says local (no P, or cheaper inside the SLO): PrefillLocal
    D dies mid-stream: Reserve on D' with prompt + tokens sent, prefill again, next token ...

A forked request (``n`` > 1: the HTTP API's n / best_of) runs that first leg once with n:
one Reserve, one prefill and push of the prompt, n first tokens; then its sequences stream
side by side (tandem/router/handoff/fork.py), each followed as a single request of its own
(``rid-j``, seed + j, ``follow``): one whose decode worker dies migrates alone carrying its
tokens so far; live moves take them one at a time, the first pushing the prompt's blocks.

Every reservation gets its own leg id (``rid``, ``rid.1``, ``rid.2`` ...), so a retry never
depends on what a failed push left behind; ``rid`` is the id the router minted for the
request (tandem/router/request.py), never the client's, so no two requests share a leg id. The client sees one stream: after a migration the
new leg's first token is the next token, so nothing is lost or repeated. Every leg still open
when the request ends abnormally (client gone, deadline, error) gets an Abort.

Every worker call is bounded (legs.py: the client's deadline or the router's default, and
cut when the health monitor takes the worker out of the pool); a failed call is retried
elsewhere within the request's deadline: Reserve tries the next decode worker (a Reserve that
ran out the router's bound gets an Abort, as it may have reserved after all), Prefill the next
prefill worker, a lost decode leg migrates. Only a channel that fails takes a worker out of
the pool here, never a slow call or a prefill worker's report about its receiver
(tandem/router/handoff/blame.py); the health monitor decides the rest.

A decode leg lost before its first token (its decode worker died, was drained or partitioned
while the prefill worker pushed to it) migrates like a stream that broke: the dead worker is
excluded, a fresh reservation is made on another one and the prompt is prefilled again. The
prefill worker holds no KV for a failed push (it aborts the request), but the prompt's blocks
it computed stay in its prefix cache, so placement sends the new leg's prefill to it (affinity)
and it recomputes little; a re-push of held KV would need a second lease on the prefill side
and a protocol to re-aim a push, for the same bytes on the wire.

Errors a client sees name no worker (tandem/router/errors.py); the logs here do.

Traced under the request's span: a ``placement`` span per prefill decision (its decision and
reason as attributes) and a client span per worker call (legs.py), whose context the call
carries to the worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing

from tandem.common.obs import tracing
from tandem.placement import policy
from tandem.placement.affinity import prefix_hashes
from tandem.placement.worker_view import Role, WorkerView
from tandem.router.api.response import TokenLogprob
from tandem.router.errors import (
    Busy,
    LegLostError,
    LegSuspendedError,
    NoWorkerError,
    WorkerCallError,
    WorkerFailedError,
)
from tandem.router.handoff import blame, legs
from tandem.router.handoff.deadline import Deadline
from tandem.router.handoff.deps import HandoffDeps, refused_for_now
from tandem.router.handoff.fork import merge_sequences
from tandem.router.handoff.leg_move import LegMove
from tandem.router.handoff.leg_precopy import LegPreCopy, precopy_leg
from tandem.router.handoff.leg_types import DecodeLeg, LegRequest, PrefillReply
from tandem.router.handoff.live_moves import MoveTicket
from tandem.router.handoff.move_gap import MoveGap
from tandem.router.handoff.open_legs import OpenLegs
from tandem.router.handoff.prefill_leg import LegPrefill
from tandem.router.request import Chunk, HandoffReport, Prepared

log = logging.getLogger(__name__)

__all__ = ["Handoff", "HandoffDeps"]


class Handoff:
    """Runs one request's legs and yields its tokens as Chunks (see the module docstring)."""

    def __init__(self, deps: HandoffDeps, request: Prepared, deadline: Deadline,
                 span: tracing.Span = tracing.NO_SPAN, sent: Sequence[int] = ()) -> None:
        """``span``: the request's, which every worker call's span goes under. ``sent``:
        tokens the client already has from an earlier leg (a forked request's sequence
        migrating on its own); the first leg then resumes after them."""
        self._deps = deps
        self._req = request
        self._deadline = deadline
        self._span = span
        config = deps.config
        self._calls = legs.LegCalls(
            deps.clients, deps.inflight, config.rpc_timeout_s, config.prefill_timeout_s
        )
        self._sent: list[int] = list(sent)
        self._n_legs = 0
        self._open = OpenLegs(request.request_id, self._calls, deps.registry, deps.counters,
                              span)
        self._mover = LegMove(deps, self._calls, self._open, request.request_id, deadline, span)
        self._precopy = LegPreCopy(deps, self._calls, self._open, request.request_id, deadline,
                                   span)
        self._prefill = LegPrefill(deps, request.request_id, deadline, span, self._calls,
                                   self._open, self._renew)
        self._leg: DecodeLeg  # the decode leg the request is on (set by _legs)
        self._adopted: DecodeLeg | None = None  # a forked request's shared leg (``follow``)
        self._moves = asyncio.Lock()  # held over a live move (a forked request: one for all)
        self._lost = ""  # why the last decode leg was lost (said when no worker takes over)
        self._hashed, self._chain = -1, []  # _hashes' memo: token count and its chain
        self.report = HandoffReport()

    async def stream(self) -> AsyncIterator[Chunk]:
        """The request's tokens, first one as soon as a prefill returns it."""
        try:
            async for chunk in self._legs():
                yield chunk
        except BaseException:
            await self._open.abort_all()
            raise

    async def follow(self, leg: DecodeLeg, moves: asyncio.Lock) -> AsyncIterator[Chunk]:
        """This request is sequence ``leg.index`` of a forked one (``_sequence``) whose first
        token the client has: its chunks from the shared ``leg`` on, followed through live
        moves as a single request's are. Raises LegLostError for ``after_loss``.
        ``moves``: the forked request's, so its sequences move one at a time: a target's
        Reserve runs after the commits it acknowledged (tandem/worker/decode/
        receiver_events.py), so the next one finds the prompt's blocks there, pushed once."""
        self._adopted = self._leg = leg
        self._moves = moves
        try:
            with self._deps.live.open(leg.endpoint, leg.leg_id, leg.index) as ticket:
                async for chunk in self._decode(ticket):
                    yield chunk
            if self._leg is not leg:  # it ended where a live move took it
                self._open.done(self._leg.endpoint, self._leg.leg_id, True)
                self._deps.held.record(self._leg.endpoint, self._hashes(self._tokens()))
        except LegLostError:
            raise
        except BaseException:
            await self._open.abort_all()
            raise
        finally:
            if self._leg is not leg:  # the shared leg's worker is the forked request's
                self._deps.registry.release(self._leg.endpoint)

    async def after_loss(self, lost: LegLostError) -> AsyncIterator[Chunk]:
        """The rest of a sequence ``follow`` lost: on another decode worker, prefilled again
        (a sequence lost on the shared leg is dropped there first)."""
        if self._leg is self._adopted:
            await self._open.abort(self._leg.endpoint, self._leg.leg_id, decode=True,
                                   index=self._leg.index)
        try:
            async for chunk in self._legs(lost):
                yield chunk
        except BaseException:
            await self._open.abort_all()
            raise

    async def _legs(self, lost: LegLostError | None = None) -> AsyncIterator[Chunk]:
        excluded: set[str] = set()
        if lost is not None:
            await self._migrate(lost, excluded)
        while True:
            if self._remaining() <= 0:  # the worker died after the last token, before saying so
                yield Chunk([], finished=True, finish_reason="length")
                return
            leg = await self._reserve(self._rank_decode(excluded))
            self._deps.registry.acquire(leg.endpoint)
            self._leg = leg
            try:
                leg, first = await self._fill(leg)
                self._leg = leg
                if self._forks():
                    async for chunk in self._sequences(leg, first):
                        yield chunk
                    return
                prompt_logprobs = [] if self._sent else list(first.prompt_logprobs)
                self._sent.append(first.first_token)
                # movable from the first token on (a move asked for once the client has it
                # finds the stream)
                with self._deps.live.open(leg.endpoint, leg.leg_id) as ticket:
                    yield Chunk([first.first_token], self._first_logprob(first),
                                leg_start=True, prompt_logprobs=prompt_logprobs)
                    async for chunk in self._decode(ticket):
                        yield chunk
                leg = self._leg  # where the stream ended (after any live move)
                self._open.done(leg.endpoint, leg.leg_id, True)
                # D now caches the whole sequence: a next turn that extends it goes there.
                self._deps.held.record(leg.endpoint, self._hashes(self._tokens()))
                return
            except LegLostError as lost:
                await self._migrate(lost, excluded)
            finally:
                self._deps.registry.release(self._leg.endpoint)

    async def _decode(self, ticket: MoveTicket) -> AsyncIterator[Chunk]:
        """The decode stream of ``self._leg`` to its end, followed through live moves
        (tandem/router/handoff/live_moves.py, ``ticket`` its entry there): ``self._leg`` is
        the leg it is on."""
        if self._deps.registry.moving_off(self._leg.endpoint):  # drained while prefilling
            self._deps.live.move_soon(self._calls, ticket,
                                      self._deps.live.cause_of(self._leg.endpoint))
        gap = MoveGap(self._deps.counters)
        ticket.prepare = lambda: self._precopy.prepare(  # a move's pre-copy: leg_precopy.py
            lambda: self._leg, self._tokens(), ticket, lambda: ticket.prepare is not None,
            lambda tokens, away: self._reserve(self._rank_decode({away}), precopy=tokens))
        try:
            while True:
                leg = self._leg
                stream = legs.decode_stream(self._calls, leg.endpoint, leg.leg_id,
                                            self._deadline.remaining(), index=leg.index,
                                            parent=self._span)
                try:
                    async with aclosing(stream):  # closed (RPC cancelled) however we leave
                        async for chunk in stream:
                            if gap.tick(len(chunk.token_ids)):  # the new leg's first: a new
                                chunk.leg_start = True  # text base
                            self._sent.extend(chunk.token_ids)
                            yield chunk
                    return
                except LegSuspendedError:
                    async with self._moves:  # a forked request's sequences: one at a time
                        if await self._move(ticket):
                            gap.moved()
        finally:  # the stream ended before a move took its pre-copy: free it
            await self._precopy.drop(ticket)

    async def _move(self, ticket: MoveTicket) -> bool:
        """``self._leg``'s stream was suspended for a live move: move it to another decode
        worker (True; its pre-copy's target first), or resume it where it is (False). Raises
        LegLostError when its worker is gone meanwhile (tandem/router/handoff/leg_move.py)."""
        src = self._leg
        pre = self._precopy.take()
        try:
            target = await self._mover.move(
                src, ticket, lambda: self._reserve(
                    self._precopy.first(self._rank_decode({src.endpoint}), pre), moving=True),
                self._sent[-1], shared=src is self._adopted)
        finally:  # the move's reservation took its blocks: freed beside the next read
            self._precopy.release_soon(pre)
        if target is None:
            return False
        self._leg = target
        return True

    def _forks(self) -> bool:
        """Whether this leg is a forked request's one shared leg (nothing sent yet)."""
        return self._req.n > 1 and not self._sent

    async def _sequences(self, leg: DecodeLeg, reply: PrefillReply) -> AsyncIterator[Chunk]:
        """The n sequences of the forked leg, merged (tandem/router/handoff/fork.py)."""
        n = self._req.n
        if len(reply.first_tokens) != n:
            log.warning("request %s: %s forked it into %d sequences, not %d",
                        self._req.request_id, leg.endpoint, len(reply.first_tokens), n)
            raise WorkerFailedError(f"the decode worker forked the request into "
                                    f"{len(reply.first_tokens)} sequences, not {n}")
        keep = self._req.logprobs.enabled
        prompt_logprobs = list(reply.prompt_logprobs)
        firsts = [Chunk([t.token_id], [t] if keep else [], leg_start=True,
                        prompt_logprobs=prompt_logprobs, index=j)
                  for j, t in enumerate(reply.first_tokens)]

        # Each sequence is a single request of its own from its second token on (its moves,
        # live or after a loss, are its own), over the shared leg until it leaves it.
        moves = asyncio.Lock()
        alone = [Handoff(self._deps, self._sequence(j), self._deadline, self._span,
                         first.token_ids) for j, first in enumerate(firsts)]

        def stream_of(j: int) -> AsyncIterator[Chunk]:
            return alone[j].follow(dataclasses.replace(leg, index=j), moves)

        def migrate(j: int, sent: list[int], lost: LegLostError) -> AsyncIterator[Chunk]:
            return alone[j].after_loss(lost)

        try:
            async with aclosing(merge_sequences(firsts, stream_of, migrate)) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            self.report.migrations += sum(one.report.migrations for one in alone)
        self._open.done(leg.endpoint, leg.leg_id, True)
        self._deps.held.record(leg.endpoint, self._hashes(self._tokens()))

    def _sequence(self, j: int) -> Prepared:
        """Sequence ``j`` of this forked request as a single request of its own: seed + j
        (what the decode worker's fork gave it), leg ids ``rid-j``, ``rid-j.1``, ..."""
        sampling = self._req.sampling
        if sampling.seed is not None:
            sampling = dataclasses.replace(sampling, seed=(sampling.seed + j) % 2**63)
        return dataclasses.replace(self._req, request_id=f"{self._req.request_id}-{j}",
                                   sampling=sampling, n=1)

    async def _migrate(self, lost: LegLostError, excluded: set[str]) -> None:
        """Give up on a dead decode leg; the loop then opens the next one elsewhere (never on
        that worker again for this request)."""
        self._open.leg_lost(lost)
        self._lost = str(lost)
        excluded.add(lost.endpoint)
        await self._open.close_decode_legs(lost.endpoint)
        self.report.migrations += 1
        if self.report.migrations > self._deps.config.max_migrations:
            raise WorkerFailedError(
                f"{lost}; gave up after {self._deps.config.max_migrations} migrations"
            )
        self._deps.counters.migrations += 1

    def _hashes(self, tokens: list[int]) -> list[int]:
        """The prefix-cache chain of ``tokens`` (the next leg's; memoized per length)."""
        if self._hashed != len(tokens):
            self._chain = prefix_hashes(tokens, self._deps.config.block_size,
                                        adapter=self._req.lora)
            self._hashed = len(tokens)
        return self._chain

    def _holders(self, role: Role) -> list[WorkerView]:
        """The routable workers of ``role`` that serve the request's LoRA adapter."""
        lora = self._req.lora
        return [w for w in self._deps.registry.routable(role) if w.holds_adapter(lora)]

    def _rank_decode(self, excluded: set[str]) -> list[str]:
        deps = self._deps
        workers = self._holders(Role.DECODE)
        hashes = self._hashes(self._tokens())
        matched = {w.endpoint: deps.held.matched(w, hashes) for w in workers}
        ranked = policy.rank_decode(
            workers,  # a forked request's sequences share its prompt, not their outputs
            len(self._req.prompt_ids) + self._req.max_tokens * (self._req.n if self._forks()
                                                                 else 1),
            deps.config.block_size,
            excluded,
            matched,
            deps.config.decode_affinity_slack,
        )
        if not ranked:
            after = f" to move the request to after: {self._lost}" if self._lost else ""
            raise NoWorkerError(f"no healthy decode worker{after}")
        return [w.endpoint for w in ranked]

    async def _reserve(self, endpoints: list[str], moving: bool = False,
                       precopy: list[int] | None = None) -> DecodeLeg:
        """Reserve on the first of ``endpoints`` that accepts (``moving``: as a live move's
        target, for the tokens so far but the last, which the move's COMMIT carries;
        ``precopy``: a move's pre-copy of these leading tokens)."""
        deps = self._deps
        exhausted: list[tuple[int, Busy | None]] = []  # the full workers' hints and reasons
        failed: WorkerCallError | None = None
        for i, endpoint in enumerate(endpoints):
            if i:
                deps.counters.reserve_retries += 1
            leg_id = (
                self._req.request_id
                if self._n_legs == 0
                else f"{self._req.request_id}.{self._n_legs}"
            )
            self._n_legs += 1
            try:
                leg = (self._leg_request(leg_id, moving) if precopy is None
                       else precopy_leg(leg_id, precopy, self._req.lora))
                reply = await legs.reserve(self._calls, endpoint, leg,
                                           deps.config.lease_s, self._deadline.remaining(),
                                           self._span)
            except WorkerCallError as err:
                legs.raise_if_fatal(err)
                if err.code_name == "RESOURCE_EXHAUSTED":
                    exhausted.append((err.retry_after_ms or deps.config.retry_after_ms,
                                      err.busy))
                    continue
                failed = err
                self._open.call_failed(err)
                if blame.slow(err):  # it may have reserved after the router stopped waiting
                    await self._open.abort(endpoint, leg_id, decode=True)
                continue
            self._open.add(endpoint, leg_id, True)
            self._deps.held.record(endpoint, self._hashes(precopy or self._tokens()))
            return DecodeLeg(endpoint, leg_id, reply)
        if exhausted:
            raise refused_for_now(exhausted)
        last = f" (last: {failed})" if failed is not None else ""
        raise NoWorkerError(f"no decode worker could take the request{last}")

    async def _renew(self, leg: DecodeLeg) -> DecodeLeg:
        """Drop a reservation a failed prefill may have half-filled; reserve afresh on D. D
        not taking it (gone meanwhile) loses the leg: it moves to another decode worker."""
        await self._open.close(leg.endpoint, leg.leg_id)
        try:
            return await self._reserve([leg.endpoint])
        except NoWorkerError as err:
            raise LegLostError(leg.endpoint, f"could not reserve again: {err}") from err

    async def _fill(self, leg: DecodeLeg) -> tuple[DecodeLeg, PrefillReply]:
        """Fill ``leg``'s reservation (tandem/router/handoff/prefill_leg.py); returns the leg
        it ended on. The first leg's figures describe the client's prompt."""
        started = time.perf_counter()
        tokens = self._tokens()
        leg, reply = await self._prefill.fill(leg, tokens, self._hashes(tokens),
                                              self._leg_request,
                                              self._holders(Role.PREFILL))
        self.report.prefill_s += time.perf_counter() - started
        if not self._sent:
            self.report.cached_tokens = reply.cached_tokens
            self.report.transfer_s = reply.transfer_s
        return leg, reply

    def _remaining(self) -> int:
        return self._req.max_tokens - len(self._sent)

    def _tokens(self) -> list[int]:
        """What the next leg prefills: the prompt plus every token already sent."""
        return self._req.prompt_ids + self._sent

    def _leg_request(self, leg_id: str, moving: bool = False) -> LegRequest:
        """The request as leg ``leg_id`` carries it: what is sent so far counts as output
        (``moving``: a live move's target, for all but the last token: its KV is computed
        by the target's first step after the move's COMMIT appends it)."""
        if moving:
            return LegRequest(leg_id, self._tokens()[:-1], self._req.sampling,
                              self._req.logprobs, len(self._sent) - 1, moved_in=True,
                              lora=self._req.lora)
        return LegRequest(
            leg_id=leg_id,
            token_ids=self._tokens(),
            sampling=self._req.sampling,
            logprobs=self._req.logprobs,
            prior_output_tokens=len(self._sent),
            n=self._req.n if self._forks() else 1,
            lora=self._req.lora,
        )

    def _first_logprob(self, reply: PrefillReply) -> list[TokenLogprob]:
        if not self._req.logprobs.enabled:
            return []
        if reply.first_logprob is not None:
            return [reply.first_logprob]
        return [TokenLogprob(token_id=reply.first_token, logprob=reply.logprob)]
