"""The decode worker's logic: reservations, commits, token streams (no gRPC in here).

A request's life on this worker (DESIGN.md section 2):

    Reserve ──> engine.reserve_remote + receiver.reserve(lease) ──> RESERVED
    RESERVED ──Committed──> engine.commit_remote: joins the running batch at the next step
             ──Aborted / Expired / Abort──> engine.abort, stream ends with an error
             ──PrefillLocal──> release the lease, prefill here under the same request id
    RUNNING  ──tokens──> RequestStream ──> Decode RPC (one reader)
    Decode cancelled by its client ──> engine.abort (blocks back to the pool)
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from decode_worker.convert import kv_layout
from decode_worker.errors import BadRequest, Draining, TransferEnded, UnknownRequest, WrongState
from decode_worker.reservations import Reservation, ReservationBook
from decode_worker.results import FirstToken, ReserveResult
from decode_worker.streams import RequestStream
from engine.async_engine import AsyncEngine
from engine.outputs import EngineStats
from engine.sampling_params import SamplingParams
from kv_transfer import Aborted, Committed, Expired, Receiver, TransferEvent
from protos.tandem.v1 import tandem_pb2

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DecodeConfig:
    """Decode-worker settings (the engine and the receiver have their own)."""

    worker_id: str
    default_lease_s: float = 30.0  # when Reserve does not say
    max_lease_s: float = 600.0
    orphan_ttl_s: float = 60.0  # an ended stream nobody reads is dropped after this


class DecodeWorker:
    """Decode-side handoff logic over an ``AsyncEngine`` and a started ``Receiver``."""

    def __init__(self, ae: AsyncEngine, receiver: Receiver, config: DecodeConfig) -> None:
        self.config = config
        self.layout = kv_layout(ae.engine.kv_layout(), ae.engine.kv_cache)
        self._ae = ae
        self._receiver = receiver
        self._book = ReservationBook()
        self._streams: dict[str, RequestStream] = {}
        self._events_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._changed = asyncio.Event()
        self.draining = False

    async def start(self) -> None:
        """Start consuming the receiver's events."""
        self._events_task = asyncio.get_running_loop().create_task(self._consume_events())

    # -- RPCs ------------------------------------------------------------------------------
    async def reserve(
        self, request_id: str, token_ids: Sequence[int], params: SamplingParams, lease_s: float
    ) -> ReserveResult:
        """Allocate blocks for a prompt and lease them to a transfer. Raises Draining,
        BadRequest/InvalidRequestError (bad input) or OutOfBlocksError (full)."""
        if self.draining:
            raise Draining()
        _check_request_id(request_id)
        if request_id in self._streams:
            raise BadRequest("request_id", f"{request_id!r} is already in use")
        lease = self._lease(lease_s)
        stream = RequestStream(request_id, self._ae, self._on_stream_end)
        self._streams[request_id] = stream  # claim the id before the first await
        # Shielded: once the engine has allocated, the reservation is recorded even if the
        # caller goes away (its lease then frees it).
        return await asyncio.shield(self._spawn(self._reserve(stream, list(token_ids), params,
                                                              lease)))

    async def _reserve(
        self, stream: RequestStream, tokens: list[int], params: SamplingParams, lease: float
    ) -> ReserveResult:
        rid = stream.request_id
        try:
            block_ids = await self._ae.call(
                lambda e: e.reserve_remote(rid, tokens, params), stream=rid
            )
        except BaseException as exc:
            self._fail(stream, exc)
            raise
        tid = uuid.uuid4().hex
        try:
            self._receiver.reserve(tid, block_ids, lease)
        except BaseException as exc:
            await self._ae.call(lambda e: e.abort(rid))
            self._fail(stream, exc)
            raise
        self._book.add(Reservation(rid, tid, tuple(tokens), params, tuple(block_ids)))
        stream.start()
        return ReserveResult(tid, block_ids, self._receiver.endpoint.encode(), self.layout)

    async def decode(self, request_id: str) -> AsyncIterator[tandem_pb2.GenerateResponse]:
        """Stream a request's messages after its first token; a client that goes away aborts
        the request. Raises UnknownRequest, WrongState, TransferEnded."""
        stream = self._streams.get(request_id)
        if stream is None:
            raise UnknownRequest(request_id)
        if stream.attached:
            raise WrongState(f"request {request_id!r} is already being streamed")
        stream.attached = True
        timer = self._timers.pop(request_id, None)
        if timer is not None:
            timer.cancel()
        done = False
        try:
            async for msg in stream.messages():
                done = msg.finished
                yield msg
        except TransferEnded:
            done = True
            raise
        finally:
            if done:
                self._forget(stream)
            else:  # the reader went away mid-stream: stop the request, free its blocks
                stream.attached = False
                self._spawn(self.abort(request_id))

    async def prefill_local(self, request_id: str) -> FirstToken:
        """Colocated fallback: drop the lease and prefill the reserved prompt on this engine
        under the same request id; returns the first token, the rest flows to Decode."""
        res = self._book.pop_request(request_id)
        if res is None:
            if request_id in self._streams:
                raise WrongState(f"request {request_id!r} has no pending reservation "
                                 "(already committed, prefilled or ended)")
            raise UnknownRequest(request_id)
        self._receiver.release(res.transfer_id, "prefilled locally by the decode worker")
        stream = self._streams[request_id]
        first = stream.expect_first()
        t0 = time.monotonic()
        return await asyncio.shield(self._spawn(self._prefill_local(res, stream, first, t0)))

    async def _prefill_local(
        self, res: Reservation, stream: RequestStream,
        first: asyncio.Future[Any], t0: float,
    ) -> FirstToken:
        rid, prompt = res.request_id, list(res.prompt_token_ids)

        def swap(engine: Any) -> None:  # one engine-thread call: the stream stays open
            engine.abort(rid)
            engine.add_request(prompt, res.params, request_id=rid)

        try:
            await self._ae.call(swap)
        except Exception as exc:
            stream.end(TransferEnded(f"local prefill failed: {exc}"))
            raise
        out = await first
        if not out.new_token_ids:
            raise TransferEnded(f"local prefill produced no token ({out.finish_reason})")
        lp = out.logprobs[0] if out.logprobs else None
        return FirstToken(out.new_token_ids[0], lp, out.num_cached_tokens, time.monotonic() - t0)

    async def abort(self, request_id: str) -> bool:
        """Stop a request wherever it is and free its blocks; False when unknown."""
        res = self._book.pop_request(request_id)
        if res is not None:
            self._receiver.release(res.transfer_id, "request aborted")
        stream = self._streams.get(request_id)
        if stream is None and res is None:
            return False
        out = await self._ae.call(lambda e: e.abort(request_id))
        if stream is not None:
            stream.end(out if out is not None else TransferEnded("request aborted"))
            if not stream.attached:
                self._forget(stream)
        return True

    async def stats(self) -> EngineStats:
        """The engine's counters right now."""
        return await self._ae.call(lambda e: e.stats())

    # -- receiver events ---------------------------------------------------------------------
    async def _consume_events(self) -> None:
        while True:
            event = await self._receiver.events.get()
            try:
                await self._on_event(event)
            except Exception:  # a bug in one request's handling must not stop every commit
                log.exception("handling %r failed", event)

    async def _on_event(self, event: TransferEvent) -> None:
        res = self._book.pop_transfer(event.transfer_id)
        if res is None:  # already ended here (Abort, PrefillLocal) while the event was queued
            log.debug("event for a reservation already ended: %r", event)
            return
        rid = res.request_id
        stream = self._streams[rid]
        if isinstance(event, Committed):
            try:
                out = await self._ae.call(
                    lambda e: e.commit_remote(rid, event.first_token, event.logprob)
                )
            except Exception as exc:  # e.g. a first token outside the vocabulary
                await self._end(stream, TransferEnded(f"commit refused: {exc}"))
                return
            stream.take_first(out)
        elif isinstance(event, Expired):
            await self._end(stream, TransferEnded("lease expired before the KV arrived"))
        elif isinstance(event, Aborted):
            await self._end(stream, TransferEnded(
                f"KV transfer aborted by the {event.by} ({event.code}): {event.reason}"))

    async def _end(self, stream: RequestStream, why: TransferEnded) -> None:
        log.info("request %s ended before decoding: %s", stream.request_id, why)
        await self._ae.call(lambda e: e.abort(stream.request_id))
        stream.end(why)

    # -- bookkeeping -------------------------------------------------------------------------
    def _lease(self, lease_s: float) -> float:
        if math.isnan(lease_s) or lease_s < 0:
            raise BadRequest("lease_s", f"must be >= 0, got {lease_s}")
        if lease_s == 0:
            return self.config.default_lease_s
        return min(lease_s, self.config.max_lease_s)

    def _on_stream_end(self, stream: RequestStream) -> None:
        if stream.attached:
            return
        loop = asyncio.get_running_loop()
        ttl = 0.0 if self.draining else self.config.orphan_ttl_s
        self._timers[stream.request_id] = loop.call_later(ttl, self._forget, stream)
        self._touch()

    def _fail(self, stream: RequestStream, exc: BaseException) -> None:
        """A reservation that never came to be: end its stream (a reader may already wait)."""
        stream.end(TransferEnded(f"reservation failed: {exc}"))
        self._forget(stream)

    def _forget(self, stream: RequestStream) -> None:
        timer = self._timers.pop(stream.request_id, None)
        if timer is not None:
            timer.cancel()
        if self._streams.get(stream.request_id) is stream:
            del self._streams[stream.request_id]
        self._touch()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _touch(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    # -- lifecycle ---------------------------------------------------------------------------
    def busy(self) -> bool:
        """True while a reservation is pending or a stream has a reader or unfinished work."""
        return len(self._book) > 0 or any(
            s.attached or not s.ended for s in self._streams.values()
        )

    def begin_drain(self) -> None:
        """Take no new reservations; what is running finishes."""
        self.draining = True
        for stream in list(self._streams.values()):
            if stream.ended and not stream.attached:
                self._forget(stream)

    async def wait_idle(self) -> None:
        """Return once nothing is pending or streaming."""
        while self.busy():
            await self._changed.wait()

    async def close(self) -> None:
        """Abort what is left, stop the event consumer, the receiver and the engine thread."""
        if self._ae.alive:
            for rid in list(self._streams):
                await self.abort(rid)
        if self._events_task is not None:
            self._events_task.cancel()
        await self._receiver.close()
        await self._ae.shutdown()


def _check_request_id(request_id: str) -> None:
    if not request_id or len(request_id) > 256:
        raise BadRequest("request_id", "must be 1..256 characters")
