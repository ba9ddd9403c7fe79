"""Filling one decode leg's reservation: remote on a prefill worker, or local on the decode
worker, as placement says.

    placement (prefill_placement.place) ──> REMOTE: the chosen prefill worker first, then the
        next ones (up to --prefill-attempts), each on a fresh reservation (``renew``)
        │  a push that failed at its receiver (P says so: blame.py) loses the decode leg:
        │  LegLostError, the ledger migrates it
        └─ every prefill worker failed ──> renew, then PrefillLocal on the decode worker
    LOCAL ──> PrefillLocal on the decode worker (its death loses the leg: LegLostError)

What each placed prefill took is learnt back (the remote overheads, the P->D link's price).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from tandem.common.obs import tracing
from tandem.placement import policy
from tandem.placement.cost_model import Decision
from tandem.placement.worker_view import WorkerView
from tandem.router.errors import LegLostError, WorkerCallError, WorkerFailedError
from tandem.router.handoff import blame, legs, prefill_placement
from tandem.router.handoff.deadline import Deadline
from tandem.router.handoff.deps import HandoffDeps
from tandem.router.handoff.leg_types import DecodeLeg, LegRequest, PrefillReply
from tandem.router.handoff.open_legs import OpenLegs

log = logging.getLogger(__name__)

Renew = Callable[[DecodeLeg], Awaitable[DecodeLeg]]  # a fresh reservation on the same worker
LegRequestOf = Callable[[str], LegRequest]  # the request as leg ``leg_id`` carries it


class LegPrefill:
    """Prefills one request's decode legs (see the module docstring)."""

    def __init__(self, deps: HandoffDeps, request_id: str, deadline: Deadline,
                 span: tracing.Span, calls: legs.LegCalls, open_legs: OpenLegs,
                 renew: Renew) -> None:
        self._deps = deps
        self._request_id = request_id
        self._deadline = deadline
        self._span = span
        self._calls = calls
        self._open = open_legs
        self._renew = renew

    async def fill(self, leg: DecodeLeg, tokens: list[int], hashes: list[int],
                   leg_request: LegRequestOf, workers: list[WorkerView]
                   ) -> tuple[DecodeLeg, PrefillReply]:
        """Fill ``leg``'s reservation with ``tokens``' KV (``hashes``: their prefix-cache
        chain) where placement says, on one of ``workers`` (the routable prefill workers
        serving the request's LoRA adapter) or locally; returns the leg it ended on and the
        prefill's reply."""
        deps, counters = self._deps, self._deps.counters
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
        blocks = policy.blocks_needed(len(tokens) - leg.reservation.skip_tokens,
                                      deps.config.block_size)
        reply: PrefillReply | None = None
        if placed.decision is Decision.REMOTE:
            ranked.sort(key=lambda w: w.endpoint != placed.endpoint)  # the chosen one first
            for i, worker in enumerate(ranked[: deps.config.prefill_attempts]):
                if i:
                    leg = await self._renew(leg)
                t0 = time.perf_counter()
                new = max(len(tokens) - cached.get(worker.endpoint, 0), 1)
                reply = await self._try_prefill(worker.endpoint, leg, new, hashes, leg_request)
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
        return leg, reply

    async def _try_prefill(self, endpoint: str, leg: DecodeLeg, new_tokens: int,
                           hashes: list[int], leg_request: LegRequestOf) -> PrefillReply | None:
        """One prefill attempt (of ``new_tokens`` uncached prompt tokens there); None when
        this worker failed and another may be tried."""
        deps = self._deps
        self._open.add(endpoint, leg.leg_id, False)
        deps.registry.acquire(endpoint)
        deps.registry.prefilling(endpoint, new_tokens)
        try:
            # D holds the reservation's cached tokens: only the rest is pushed
            reply = await legs.prefill(self._calls, endpoint, leg_request(leg.leg_id),
                                       leg.reservation, self._deadline.remaining(), self._span,
                                       receiver=leg.endpoint)
        except WorkerCallError as err:
            legs.raise_if_fatal(err)  # the leg stays open: the caller's cleanup aborts it
            self._open.done(endpoint, leg.leg_id, False)
            await self._open.abort(endpoint, leg.leg_id, decode=False)
            if blame.receiver_lost(err):  # P is fine: the decode leg is what was lost
                log.warning("request %s: prefill worker %s could not push to decode worker "
                            "%s: %s", self._request_id, endpoint, leg.endpoint, err)
                deps.affinity.record(hashes, endpoint)  # it cached them
                raise LegLostError(leg.endpoint, f"the KV push to it failed: {err.details}"
                                   ) from err
            self._open.call_failed(err)
            deps.counters.prefill_retries += 1
            return None
        finally:
            deps.registry.release(endpoint)
            deps.registry.prefilling(endpoint, -new_tokens)
        self._open.done(endpoint, leg.leg_id, False)  # done: the KV now lives on the decode worker
        return reply

    async def _prefill_local(self, leg: DecodeLeg, new_tokens: int) -> PrefillReply:
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
