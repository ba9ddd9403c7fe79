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
side by side (tandem/router/handoff/fork.py). A sequence whose decode worker dies migrates alone, as
a single request (``rid-j``, seed + j) carrying its tokens so far.

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

import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field

from tandem.common.obs import tracing
from tandem.placement import policy
from tandem.placement.affinity import PrefixAffinity, prefix_hashes
from tandem.placement.cost_model import Decision
from tandem.placement.link import LinkEstimates
from tandem.placement.log import PlacementLog
from tandem.placement.overheads import PrefillOverheads
from tandem.placement.worker_view import Role, WorkerView
from tandem.router.api.response import TokenLogprob
from tandem.router.config import RouterConfig
from tandem.router.errors import (
    Busy,
    LegLostError,
    NoWorkerError,
    OverloadedError,
    WorkerCallError,
    WorkerFailedError,
)
from tandem.router.handoff import blame, legs, prefill_placement
from tandem.router.handoff.counters import HandoffCounters
from tandem.router.handoff.deadline import Deadline
from tandem.router.handoff.fork import merge_sequences
from tandem.router.handoff.held_blocks import HeldBlocks
from tandem.router.handoff.inflight import InflightCalls
from tandem.router.handoff.leg_types import LegRequest, PrefillReply, Reservation
from tandem.router.membership.registry import Registry
from tandem.router.membership.worker_clients import WorkerClients
from tandem.router.request import Chunk, HandoffReport, Prepared

log = logging.getLogger(__name__)


GRAMMAR_COMPILING = ("the request's structured-output grammar is still compiling; retry "
                     "after the advised delay")


def _refused_for_now(refusals: list[tuple[int, Busy | None]]) -> OverloadedError:
    """What the client is told when every decode worker refused the request for now
    (RESOURCE_EXHAUSTED: ``(retry hint ms, reason)`` each): come back when the soonest
    expects to take it; when a worker's reason was the request's own grammar still
    compiling, that is the reason given (the wait is for the compile, not for room)."""
    hint = min(ms for ms, _ in refusals)
    if any(busy is Busy.GRAMMAR for _, busy in refusals):
        return OverloadedError(GRAMMAR_COMPILING, hint, Busy.GRAMMAR)
    return OverloadedError("every decode worker is full", hint)


@dataclass(frozen=True, slots=True)
class HandoffDeps:
    """What every handoff shares: the pool, the channels, the affinity map, the counters,
    the worker calls in flight (which the health monitor cuts: tandem/router/server.py), the remote
    overheads placement learns, and the prefix blocks each worker is believed to hold."""

    config: RouterConfig
    registry: Registry
    clients: WorkerClients
    affinity: PrefixAffinity
    counters: HandoffCounters
    inflight: InflightCalls = field(default_factory=InflightCalls)
    overheads: PrefillOverheads = field(default_factory=PrefillOverheads)
    links: LinkEstimates = field(default_factory=LinkEstimates)  # per P->D pair (link.py)
    held: HeldBlocks = field(default_factory=lambda: HeldBlocks(time.monotonic, 6.0))
    placement_log: PlacementLog | None = None  # --placement-log


@dataclass(slots=True)
class _Leg:
    """One reservation on a decode worker."""

    endpoint: str
    leg_id: str
    reservation: Reservation


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
        self._open: list[tuple[str, str, bool]] = []  # (endpoint, leg id, is decode) to abort
        self._lost = ""  # why the last decode leg was lost (said when no worker takes over)
        self._hashed, self._chain = -1, []  # _hashes' memo: token count and its chain
        self.report = HandoffReport()

    async def stream(self) -> AsyncIterator[Chunk]:
        """The request's tokens, first one as soon as a prefill returns it."""
        try:
            async for chunk in self._legs():
                yield chunk
        except BaseException:
            await self._abort_open()
            raise

    async def _legs(self) -> AsyncIterator[Chunk]:
        excluded: set[str] = set()
        while True:
            if self._remaining() <= 0:  # the worker died after the last token, before saying so
                yield Chunk([], finished=True, finish_reason="length")
                return
            leg = await self._reserve(self._rank_decode(excluded))
            self._deps.registry.acquire(leg.endpoint)
            try:
                leg, first = await self._prefill(leg)
                if self._forks():
                    async for chunk in self._sequences(leg, first):
                        yield chunk
                    return
                prompt_logprobs = [] if self._sent else list(first.prompt_logprobs)
                self._sent.append(first.first_token)
                yield Chunk([first.first_token], self._first_logprob(first), leg_start=True,
                            prompt_logprobs=prompt_logprobs)
                stream = legs.decode_stream(
                    self._calls, leg.endpoint, leg.leg_id, self._deadline.remaining(),
                    parent=self._span,
                )
                async with aclosing(stream):  # closed (RPC cancelled) however we leave
                    async for chunk in stream:
                        self._sent.extend(chunk.token_ids)
                        yield chunk
                self._open.remove((leg.endpoint, leg.leg_id, True))
                # D now caches the whole sequence: a next turn that extends it goes there.
                self._deps.held.record(leg.endpoint, self._hashes(self._tokens()))
                return
            except LegLostError as lost:
                await self._migrate(lost, excluded)
            finally:
                self._deps.registry.release(leg.endpoint)

    def _forks(self) -> bool:
        """Whether this leg is a forked request's one shared leg (nothing sent yet)."""
        return self._req.n > 1 and not self._sent

    async def _sequences(self, leg: _Leg, reply: PrefillReply) -> AsyncIterator[Chunk]:
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

        def stream_of(j: int) -> AsyncIterator[Chunk]:
            return legs.decode_stream(self._calls, leg.endpoint, leg.leg_id,
                                      self._deadline.remaining(), index=j, parent=self._span)

        async def migrate(j: int, sent: list[int], lost: LegLostError) -> AsyncIterator[Chunk]:
            self._leg_lost(lost)
            await self._abort(leg.endpoint, leg.leg_id, decode=True, index=j)
            self.report.migrations += 1
            if self._deps.config.max_migrations < 1:
                raise WorkerFailedError(f"{lost}; gave up after 0 migrations")
            self._deps.counters.migrations += 1
            alone = Handoff(self._deps, self._sequence(j), self._deadline, self._span, sent)
            alone._lost = str(lost)
            try:
                async with aclosing(alone.stream()) as chunks:
                    async for chunk in chunks:
                        yield chunk
            finally:
                self.report.migrations += alone.report.migrations

        async with aclosing(merge_sequences(firsts, stream_of, migrate)) as chunks:
            async for chunk in chunks:
                yield chunk
        self._open.remove((leg.endpoint, leg.leg_id, True))
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
        self._leg_lost(lost)
        self._lost = str(lost)
        excluded.add(lost.endpoint)
        await self._close_decode_legs(lost.endpoint)
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

    async def _reserve(self, endpoints: list[str]) -> _Leg:
        """Reserve on the first of ``endpoints`` that accepts."""
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
                reply = await legs.reserve(self._calls, endpoint, self._leg_request(leg_id),
                                           deps.config.lease_s, self._deadline.remaining(),
                                           self._span)
            except WorkerCallError as err:
                legs.raise_if_fatal(err)
                if err.code_name == "RESOURCE_EXHAUSTED":
                    exhausted.append((err.retry_after_ms or deps.config.retry_after_ms,
                                      err.busy))
                    continue
                failed = err
                self._call_failed(err)
                if blame.slow(err):  # it may have reserved after the router stopped waiting
                    await self._abort(endpoint, leg_id, decode=True)
                continue
            self._open.append((endpoint, leg_id, True))
            self._deps.held.record(endpoint, self._hashes(self._tokens()))
            return _Leg(endpoint, leg_id, reply)
        if exhausted:
            raise _refused_for_now(exhausted)
        last = f" (last: {failed})" if failed is not None else ""
        raise NoWorkerError(f"no decode worker could take the request{last}")

    async def _renew(self, leg: _Leg) -> _Leg:
        """Drop a reservation a failed prefill may have half-filled; reserve afresh on D. D
        not taking it (gone meanwhile) loses the leg: it moves to another decode worker."""
        await self._close_decode_leg(leg)
        try:
            return await self._reserve([leg.endpoint])
        except NoWorkerError as err:
            raise LegLostError(leg.endpoint, f"could not reserve again: {err}") from err

    async def _prefill(self, leg: _Leg) -> tuple[_Leg, PrefillReply]:
        """Fill ``leg``'s reservation where placement says (remote on a prefill worker, or
        local on D; remote falls back to local); returns the leg it ended on."""
        deps, counters = self._deps, self._deps.counters
        tokens = self._tokens()
        workers = self._holders(Role.PREFILL)
        started = time.perf_counter()
        hashes = self._hashes(tokens)
        owners = deps.affinity.lookup(hashes) if workers else []
        ranked = policy.rank_prefill(workers, owners, deps.config.affinity_max_queue)
        cached = prefill_placement.cached_tokens(
            deps.config.block_size, deps.held, owners, ranked, hashes, leg.endpoint,
            leg.reservation.cached_tokens)
        with tracing.span("placement", self._span) as span:
            placed = prefill_placement.place(
                deps.config, deps.registry, deps.overheads, len(tokens), leg.endpoint, ranked,
                cached, deps.placement_log, deps.links,
                prefill_placement.push_bytes(leg.reservation, len(tokens)))
            span.set_attributes({"tandem.decision": placed.decision.value,
                                 "tandem.reason": placed.reason.value,
                                 "tandem.prompt_tokens": len(tokens)})
        counters.count_placement(placed)
        # The KV blocks D lacks: what a remote prefill pushes, the size the overheads fit by.
        blocks = policy.blocks_needed(len(tokens) - leg.reservation.cached_tokens,
                                      deps.config.block_size)
        reply: PrefillReply | None = None
        if placed.decision is Decision.REMOTE:
            ranked.sort(key=lambda w: w.endpoint != placed.endpoint)  # the chosen one first
            for i, worker in enumerate(ranked[: deps.config.prefill_attempts]):
                if i:
                    leg = await self._renew(leg)
                t0 = time.perf_counter()
                new = max(len(tokens) - cached.get(worker.endpoint, 0), 1)
                reply = await self._try_prefill(worker.endpoint, leg, new)
                if reply is not None:
                    call_s = time.perf_counter() - t0
                    pushed = prefill_placement.push_bytes(leg.reservation, len(tokens))
                    deps.affinity.record(hashes, worker.endpoint)
                    deps.held.record(worker.endpoint, hashes)
                    predicted = placed.predicted if i == 0 else prefill_placement.predict_remote(
                        deps.registry, worker, leg.endpoint, new, deps.links, pushed)
                    prefill_placement.learn_overhead(deps.overheads, predicted, blocks, call_s)
                    prefill_placement.learn_link(deps.links, worker.endpoint, leg.endpoint,
                                                 pushed, call_s, reply.prefill_s)
                    break
            if reply is None:
                counters.local_prefill_fallbacks += 1
                leg = await self._renew(leg)
        if reply is None:
            t0 = time.perf_counter()
            reply = await self._prefill_local(leg, len(tokens) - leg.reservation.cached_tokens)
            if placed.decision is Decision.LOCAL:  # a fallback's time was not predicted
                prefill_placement.learn_overhead(deps.overheads, placed.predicted, blocks,
                                                 time.perf_counter() - t0)
        self.report.prefill_s += time.perf_counter() - started
        if not self._sent:  # the first leg's figures describe the client's prompt
            self.report.cached_tokens = reply.cached_tokens
            self.report.transfer_s = reply.transfer_s
        return leg, reply

    async def _try_prefill(self, endpoint: str, leg: _Leg, new_tokens: int
                           ) -> PrefillReply | None:
        """One prefill attempt (of ``new_tokens`` uncached prompt tokens there); None when
        this worker failed and another may be tried."""
        deps = self._deps
        key = (endpoint, leg.leg_id, False)
        self._open.append(key)
        deps.registry.acquire(endpoint)
        deps.registry.prefilling(endpoint, new_tokens)
        try:
            # D holds the reservation's cached tokens: only the rest is pushed
            reply = await legs.prefill(self._calls, endpoint, self._leg_request(leg.leg_id),
                                       leg.reservation, self._deadline.remaining(), self._span,
                                       receiver=leg.endpoint)
        except WorkerCallError as err:
            legs.raise_if_fatal(err)  # the leg stays open: the caller's cleanup aborts it
            self._open.remove(key)
            await self._abort(endpoint, leg.leg_id, decode=False)
            if blame.receiver_lost(err):  # P is fine: the decode leg is what was lost
                log.warning("request %s: prefill worker %s could not push to decode worker "
                            "%s: %s", self._req.request_id, endpoint, leg.endpoint, err)
                deps.affinity.record(self._hashes(self._tokens()), endpoint)  # it cached them
                raise LegLostError(leg.endpoint, f"the KV push to it failed: {err.details}"
                                   ) from err
            self._call_failed(err)
            deps.counters.prefill_retries += 1
            return None
        finally:
            deps.registry.release(endpoint)
            deps.registry.prefilling(endpoint, -new_tokens)
        self._open.remove(key)  # done: the KV now lives on the decode worker
        return reply

    async def _prefill_local(self, leg: _Leg, new_tokens: int) -> PrefillReply:
        registry = self._deps.registry
        registry.prefilling(leg.endpoint, new_tokens)
        try:
            return await legs.prefill_local(
                self._calls, leg.endpoint, leg.leg_id, self._deadline.remaining(), self._span
            )
        except WorkerCallError as err:
            legs.raise_if_fatal(err)
            if err.code_name in legs.WORKER_GONE:  # D itself went (a drain, a crash): migrate
                raise LegLostError(leg.endpoint, str(err),
                                   down=blame.takes_out_of_pool(err)) from err
            raise WorkerFailedError(f"no prefill succeeded; last: {err}") from err
        finally:
            registry.prefilling(leg.endpoint, -new_tokens)

    def _remaining(self) -> int:
        return self._req.max_tokens - len(self._sent)

    def _tokens(self) -> list[int]:
        """What the next leg prefills: the prompt plus every token already sent."""
        return self._req.prompt_ids + self._sent

    def _leg_request(self, leg_id: str) -> LegRequest:
        """The request as leg ``leg_id`` carries it: what is sent so far counts as output."""
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

    def _call_failed(self, err: WorkerCallError) -> None:
        """Log a failed call (with its worker's address, which the client's error does not
        name); the worker leaves the pool only when the failure says it is gone
        (tandem/router/handoff/blame.py)."""
        if blame.takes_out_of_pool(err):
            self._mark_down(err.endpoint, str(err))
        else:
            log.info("request %s: %s on %s failed, trying elsewhere: %s",
                     self._req.request_id, err.method, err.endpoint, err)

    def _leg_lost(self, lost: LegLostError) -> None:
        """Log a lost decode leg; its worker leaves the pool only when the loss says it is
        gone (the channel failed, or the health monitor cut it)."""
        if lost.down:
            self._mark_down(lost.endpoint, lost.reason)
        else:
            log.warning("request %s: decode leg on %s lost, moving it: %s",
                        self._req.request_id, lost.endpoint, lost.reason)

    def _mark_down(self, endpoint: str, why: str) -> None:
        """Take a failing worker out of the pool until a health probe passes again."""
        if self._deps.registry.set_healthy(endpoint, False):
            log.warning("worker %s left the pool: %s", endpoint, why)

    async def _close_decode_leg(self, leg: _Leg) -> None:
        self._open.remove((leg.endpoint, leg.leg_id, True))
        await self._abort(leg.endpoint, leg.leg_id, decode=True)

    async def _close_decode_legs(self, endpoint: str) -> None:
        """Abort every decode leg still open on ``endpoint`` (a lost one, whichever of its
        reservations it got to)."""
        for key in [k for k in self._open if k[0] == endpoint and k[2]]:
            self._open.remove(key)
            await self._abort(endpoint, key[1], decode=True)

    async def _abort(self, endpoint: str, leg_id: str, decode: bool,
                     index: int | None = None) -> None:
        self._deps.counters.aborts_sent += 1
        await legs.abort(self._calls, endpoint, leg_id, decode, index, self._span)

    async def _abort_open(self) -> None:
        """Tell every worker still holding a leg of this request to drop it."""
        open_legs, self._open = self._open, []
        for endpoint, leg_id, decode in open_legs:
            await self._abort(endpoint, leg_id, decode)
