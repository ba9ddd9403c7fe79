"""The decode worker's logic: reservations, commits, token streams (no gRPC in here).

A request's life on this worker (DESIGN.md section 2). The reservation's one record is the
engine's ledger (tandem/engine/core/remote_kv.py), named by the transfer id minted here at Reserve
and kept on the request's ``RequestStream``; receiver events map to requests through it.

    Reserve ──> engine.remote.decode.reserve(transfer_id): the prompt's cached prefix + blocks
            for the rest; receiver.reserve(lease) on those only (a push never writes a shared
            block)
            ──> RESERVED (the reply says how many prompt tokens were cached)
    RESERVED ──Committed──> remote.decode.commit_forked: joins the running batch next step
             ──Aborted / Expired──> remote.decode.end: blocks freed, the stream ends (error)
             ──Abort──> receiver.release, then engine.abort
             ──PrefillLocal──> receiver.release, then remote.decode.prefill_locally (same id)
    RUNNING  ──tokens──> RequestStream ──> Decode RPC (one reader)
    Decode cancelled by its client, or its connection gone (the router crashed, keepalive
        found it silent) ──> engine.abort at once (blocks back to the pool)
    no reader within ``attach_lease_s`` of the first token (or of the end) ──> engine.abort,
        the stream dropped: the router calls Decode right after the prefill reply, so a
        reader that has not come by then never will (it crashed in between)
    RUNNING ──Suspend──> out of the batch, the Decode stream ends after every token so far
            ──MoveOut──> pushed to another decode worker, committed there: freed here
            ──Resume, or a MoveOut that failed──> back in the batch, a new Decode reads on
            neither within ``attach_lease_s`` (the router went away) ──> engine.abort
        (stream_moves.py, moves.py); a reservation made with ``moved_in`` is such a
        move's target: its COMMIT's token was streamed by the worker it moved from
    RUNNING ──PreCopy──> before a Suspend: its full blocks pushed ahead (precopy_leases.py)

A forked request (``n`` > 1) is one reservation, one push and one COMMIT carrying n first
tokens; the engine forks it into n sequences sharing the pushed blocks, each with its own
``RequestStream`` (Decode names it by index). Abort without an index ends them all; with one,
that sequence only (before the fork, a sequence cannot leave alone: the request goes). After
the fork a sequence moves live on its own (Suspend, MoveOut and Resume name it by index); the
blocks it shares with its siblings stay here until the last of them is freed.

Two orderings keep the blocks safe:
  release before free: Abort and PrefillLocal end the receiver's lease (after which no frame
      is written into the blocks) before the engine call that frees them; Committed, Aborted
      and Expired come from a receiver that has ended the lease itself.
  first end wins: every end of a reservation (commit, end, abort, local prefill) is engine
      work, serialized by the engine's bookkeeping lock (on its thread, or beside a step's
      forward: AsyncEngine.submit_now); the ledger gives the reservation to the first and
      answers the others None (or UnknownRequestError). Abort and PrefillLocal wait for a
      Reserve still in flight, so a lease is never granted on blocks already freed.
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

from tandem.engine.async_engine import AsyncEngine
from tandem.engine.core.request import sequence_id
from tandem.engine.errors import UnknownRequestError
from tandem.engine.outputs import EngineStats
from tandem.engine.sampling_params import SamplingParams
from tandem.kv_transfer import Receiver, Sender
from tandem.worker.commit_hold import CommitHold
from tandem.worker.decode.moves import LiveMoves, Suspended
from tandem.worker.decode.precopy_leases import PreCopyLeases
from tandem.worker.decode.reader_leases import ReaderLeases
from tandem.worker.decode.receiver_events import ReceiverEvents
from tandem.worker.decode.reserve_checks import check_reserve
from tandem.worker.decode.results import ReserveResult, StreamMessage
from tandem.worker.decode.stream_moves import StreamMoves
from tandem.worker.decode.streams import RequestStream
from tandem.worker.errors import BadRequest, Draining, TransferEnded, UnknownRequest, WrongState
from tandem.worker.first_token import FirstToken
from tandem.worker.metrics import TransferTotals, WorkerMetrics
from tandem.worker.tp_group import GroupAgents

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DecodeConfig:
    """Decode-worker settings (the engine and the receiver have their own)."""

    worker_id: str
    default_lease_s: float = 30.0  # when Reserve does not say
    max_lease_s: float = 600.0
    # A committed stream nobody reads is aborted (its blocks freed) and dropped this long
    # after its first token (or its end, if that came first). The router's Decode follows
    # the prefill reply within milliseconds; a reader that has not come by then is gone.
    attach_lease_s: float = 10.0
    # While draining, an unread stream waits for its reader at most this long: a drain must
    # end well inside a pod's termination grace period (30 s by default).
    drain_orphan_grace_s: float = 5.0
    transfer_timeout_s: float = 30.0  # a live move's push, from its open to the COMMIT's ACK


class DecodeWorker:
    """Decode-side handoff logic over an ``AsyncEngine`` and a started ``Receiver``."""

    def __init__(
        self,
        ae: AsyncEngine,
        receiver: Receiver,
        config: DecodeConfig,
        metrics: WorkerMetrics | None = None,
        sender: Sender | None = None,
        hold: CommitHold | None = None,
        agents: GroupAgents | None = None,
        kv_endpoint: str | None = None,
    ) -> None:
        """``sender``: pushes a live move's KV (None: this worker's streams cannot move);
        ``hold``: a test-only pause before a move's COMMIT (tandem/worker/commit_hold.py);
        ``agents``: ranks 1..N-1 of this worker's tensor-parallel group, each holding every
        reservation for its own KV heads (tandem/worker/tp_group.py); ``kv_endpoint``: what
        Reserve answers (the group's endpoint; None: the receiver's)."""
        self.config = config
        self._agents = agents
        self.kv_endpoint = kv_endpoint or receiver.endpoint.encode()
        self.metrics = metrics if metrics is not None else WorkerMetrics("decode")
        self.layout = receiver.layout
        self._ae = ae
        self._receiver = receiver
        self._streams: dict[str, RequestStream] = {}  # by sequence id (tandem/engine/core/request.py)
        self._groups: dict[str, list[RequestStream]] = {}  # a request's streams, by index
        self._reserving: dict[str, asyncio.Task[ReserveResult]] = {}  # Reserves in flight
        self._precopies = PreCopyLeases(lambda rid: self._spawn(self.abort(rid)))
        self._events_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._leases = ReaderLeases(config.attach_lease_s, config.drain_orphan_grace_s,
                                    self._unread)
        self._changed = asyncio.Event()
        self._events = ReceiverEvents(ae, receiver, agents, self.metrics, self._streams,
                                      self._groups, self.await_reader)
        self._live_moves = LiveMoves(ae, sender, receiver.layout, config.transfer_timeout_s,
                                     hold)
        self.moves = StreamMoves(self, self._live_moves)  # the live-move RPCs
        self.draining = False

    @property
    def engine(self) -> AsyncEngine:
        """The engine this worker serves (its LoraAdapters service runs over it too)."""
        return self._ae

    async def start(self) -> None:
        """Start consuming the receiver's events."""
        self._events_task = asyncio.get_running_loop().create_task(self._events.consume())

    # -- RPCs ------------------------------------------------------------------------------
    async def reserve(
        self,
        request_id: str,
        token_ids: Sequence[int],
        params: SamplingParams,
        lease_s: float,
        prior_output_tokens: int = 0,
        n: int = 1,
        moved_in: bool = False,
        precopy: bool = False,
    ) -> ReserveResult:
        """Allocate blocks for a prompt and lease them to a transfer. Raises Draining,
        BadRequest/InvalidRequestError (bad input) or OutOfBlocksError (full).

        ``prior_output_tokens``: a migrated request's tokens generated by an earlier leg (the
        tail of ``token_ids``); see ``LLMEngine.add_request``. ``n``: the sequences a forked
        request becomes at commit (one reservation for its prompt, a stream per sequence).
        ``moved_in``: a live move's target (its COMMIT's token was streamed already).
        ``precopy``: a live move's pre-copy, held once committed (precopy_leases.py)."""
        if self.draining:
            raise Draining()
        check_reserve(request_id, token_ids, n, prior_output_tokens, moved_in, precopy,
                      self.layout.block_size)
        if request_id in self._groups:
            raise BadRequest("request_id", f"{request_id!r} is already in use")
        lease = self._lease(lease_s)
        tid = uuid.uuid4().hex
        group = [RequestStream(sequence_id(request_id, j), tid, self._ae, self._on_stream_end,
                               self.metrics.inter_token, index=j, group_id=request_id,
                               moved_in=moved_in)
                 for j in range(n)]
        self._groups[request_id] = group  # claim the ids before the first await
        for stream in group:
            self._streams[stream.request_id] = stream
        # Shielded: once the engine has allocated, the reservation is recorded even if the
        # caller goes away (its lease then frees it).
        task = self._spawn(self._reserve(group, list(token_ids), params, lease,
                                         prior_output_tokens, precopy))
        self._reserving[request_id] = task
        task.add_done_callback(
            lambda t: self._reserving.pop(request_id) if self._reserving.get(request_id) is t
            else None)
        return await asyncio.shield(task)

    async def _reserve(
        self,
        group: list[RequestStream],
        tokens: list[int],
        params: SamplingParams,
        lease: float,
        prior: int,
        precopy: bool = False,
    ) -> ReserveResult:
        rid, tid, n = group[0].request_id, group[0].transfer_id, len(group)
        try:
            await self._ae.prepare(params)
            # The commits acknowledged so far are queued ahead of this call, with no await
            # between: their blocks are cached when it looks (receiver_events.py). With none
            # queued it runs at once, beside a step's forward (AsyncEngine.call_now).
            self._events.take_reported()
            granted, adapter = await self._ae.call_now(
                lambda e: (e.remote.decode.reserve(rid, tokens, params, prior, tid, n, precopy),
                           e.lora_identity(params.lora)),
                stream=[s.request_id for s in group],
            )
        except BaseException as exc:
            self._fail(group, exc)
            raise
        block_ids = granted.fill_block_ids  # the skipped blocks (cached, behind the window)
        try:
            self._receiver.reserve(tid, block_ids, lease, adapter)  # BEGIN must match it
            if self._agents is not None:  # every rank holds the blocks for its own heads
                await self._agents.reserve(tid, block_ids, lease, adapter)
        except BaseException as exc:
            self._receiver.release(tid, "the group could not reserve")
            await self._ae.call(lambda e: e.remote.decode.end(tid))  # never leased: unwritten
            self._fail(group, exc)
            raise
        for stream in group:
            stream.start()
        if precopy:  # held once committed: at most for the lease, whoever forgets it
            self._precopies.start(rid, lease)
        return ReserveResult(tid, block_ids, self.kv_endpoint, self.layout,
                             granted.cached_tokens, adapter, granted.skip_tokens)

    async def decode(self, request_id: str, index: int = 0) -> AsyncIterator[StreamMessage]:
        """Stream the messages of a request's sequence ``index`` (0 unless it is forked)
        after its first token; a client that goes away aborts that sequence. Raises
        UnknownRequest, WrongState, TransferEnded."""
        stream = self.sequence_stream(request_id, index)
        if stream.attached:
            raise WrongState(f"request {request_id!r} is already being streamed")
        stream.attached = True
        self._leases.cancel(stream)
        done = suspended = False
        try:
            async for msg in stream.messages():
                done = msg.finished
                yield msg
        except TransferEnded:
            done = True
            raise
        except Suspended:
            suspended = True  # kept for MoveOut or Resume, under the attach lease
            raise
        finally:
            if done:
                self._forget(stream)
            elif suspended:
                stream.attached = False
                self.await_reader(stream)
            else:  # the reader went away mid-stream: stop the sequence, free its blocks
                stream.attached = False
                self._spawn(self.abort(request_id, index))

    async def prefill_local(self, request_id: str) -> FirstToken:
        """Colocated fallback: drop the lease and prefill the reserved prompt on this engine
        under the same request id; returns the first token (a forked request's: every
        sequence's), the rest flows to Decode. Raises UnknownRequest, WrongState (no pending
        reservation) or TransferEnded."""
        group = self._groups.get(request_id)
        if group is None:
            raise UnknownRequest(request_id)
        await self._reserve_settled(request_id)
        t0 = time.monotonic()
        return await asyncio.shield(self._spawn(self._prefill_local(group, t0)))

    async def _prefill_local(self, group: list[RequestStream], t0: float) -> FirstToken:
        rid = group[0].request_id
        # release before free: no frame lands in the blocks once this returns
        self._events.release(group[0].transfer_id, "prefilled locally by the decode worker")
        try:
            await self._ae.call(lambda e: e.remote.decode.prefill_locally(rid))
        except UnknownRequestError:
            raise WrongState(f"request {rid!r} has no pending reservation "
                             "(already committed, prefilled or ended)") from None
        except Exception as exc:
            for stream in group:
                stream.end(TransferEnded(f"local prefill failed: {exc}"))
            raise
        # Nothing of the local prefill can be in the streams yet: the first outputs come from
        # a step the engine thread takes after this call's reply, and are delivered behind it.
        firsts = [stream.expect_first() for stream in group]
        outs = [await first for first in firsts]
        for stream in group:
            self.await_reader(stream)
        if any(not o.new_token_ids for o in outs):
            raise TransferEnded(f"local prefill produced no token ({outs[0].finish_reason})")
        seconds = time.monotonic() - t0
        self.metrics.first_token(seconds)
        return FirstToken.of(outs, seconds)

    async def abort(self, request_id: str, index: int | None = None) -> bool:
        """Stop a request wherever it is and free its blocks (``index``: only that sequence
        of a forked one, once it has forked; before, the whole request); False when
        unknown. One that arrives while the request's Reserve is still in flight waits for
        it, and completes even when its caller stops waiting (the router bounds its Abort):
        a Reserve the router gave up on is freed as soon as it is made, not at its lease."""
        return await asyncio.shield(self._spawn(self._abort(request_id, index)))

    async def _abort(self, request_id: str, index: int | None) -> bool:
        group = self._groups.get(request_id)
        if group is None:
            return False
        await self._reserve_settled(request_id)
        streams = list(group)
        if index is not None:
            one = self._streams.get(sequence_id(request_id, index))
            if one is None or one not in group:
                return False
            if one.started:  # forked: the others go on
                streams = [one]
        # release before free: no frame lands in the blocks once this returns
        self._events.release(group[0].transfer_id, "request aborted")
        ids = [s.request_id for s in streams]
        for sid in ids:
            self.moves.forget(sid)
        outs = await self._ae.call(lambda e: [e.abort(sid) for sid in ids])
        for stream, out in zip(streams, outs, strict=True):
            stream.end(out if out is not None else TransferEnded("request aborted"))
            if not stream.attached:
                self._forget(stream)
        return True

    async def _reserve_settled(self, request_id: str) -> None:
        """Wait for the request's Reserve if it is still in flight (whatever its outcome)."""
        task = self._reserving.get(request_id)
        if task is not None:
            await asyncio.wait([task])

    # -- the stream table, as the live moves see it (stream_moves.MoveHost) --------------------
    def sequence_stream(self, request_id: str, index: int) -> RequestStream:
        """The stream of a request's sequence ``index`` (0 unless it is forked). Raises
        UnknownRequest."""
        group = self._groups.get(request_id)
        stream = self._streams.get(sequence_id(request_id, index)) if group else None
        if stream is None:
            raise UnknownRequest(request_id if not index else f"{request_id} sequence {index}")
        return stream

    def renew_stream(self, old: RequestStream) -> RequestStream:
        """A fresh stream in ``old``'s place (a resumed sequence's), not started."""
        stream = RequestStream(old.request_id, old.transfer_id, self._ae, self._on_stream_end,
                               self.metrics.inter_token, index=old.index,
                               group_id=old.group_id)
        stream.started = True
        self._streams[old.request_id] = stream
        group = self._groups[old.group_id]
        group[group.index(old)] = stream
        return stream

    def cancel_reader_wait(self, stream: RequestStream) -> None:
        """Stop ``stream``'s attach lease."""
        self._leases.cancel(stream)

    async def stats(self) -> EngineStats:
        """The engine's counters right now (as of its current step's start while one runs:
        AsyncEngine.stats)."""
        return await self._ae.stats()

    def transfer_totals(self) -> TransferTotals:
        """KV received, transfers that failed (aborted or expired), blocks leased right now."""
        rx = self._receiver.stats()
        return TransferTotals(rx.bytes_received, rx.aborted + rx.expired, rx.held_blocks)

    # -- bookkeeping -------------------------------------------------------------------------
    def _lease(self, lease_s: float) -> float:
        if math.isnan(lease_s) or lease_s < 0:
            raise BadRequest("lease_s", f"must be >= 0, got {lease_s}")
        if lease_s == 0:
            return self.config.default_lease_s
        return min(lease_s, self.config.max_lease_s)

    def _on_stream_end(self, stream: RequestStream) -> None:
        # Its reader may still be on the way: the router calls Decode after the prefill
        # reply, and a short request can end before that.
        self.await_reader(stream)
        self._touch()

    def await_reader(self, stream: RequestStream) -> None:
        """Give a stream that has something to read and no reader the attach lease
        (tandem/worker/decode/reader_leases.py)."""
        self._leases.lease(stream)

    def _unread(self, stream: RequestStream) -> None:
        """The attach lease of ``stream`` ran out with no reader: stop it and drop it."""
        if stream.attached or self._streams.get(stream.request_id) is not stream:
            return
        if stream.ended and not self.moves.holds(stream.request_id):
            self._forget(stream)
            return
        log.warning("request %s: no reader within %.3g s of its first token; aborted",
                    stream.request_id, self.config.attach_lease_s)
        self._spawn(self.abort(stream.group_id, stream.index))  # frees it, then forgets it

    def _fail(self, group: list[RequestStream], exc: BaseException) -> None:
        """A reservation that never came to be: end its streams (a reader may already wait)."""
        for stream in group:
            stream.end(TransferEnded(f"reservation failed: {exc}"))
            self._forget(stream)

    def _forget(self, stream: RequestStream) -> None:
        self._leases.cancel(stream)
        if self._streams.get(stream.request_id) is stream:
            del self._streams[stream.request_id]
        group = self._groups.get(stream.group_id)
        if group is not None and not any(self._streams.get(s.request_id) is s for s in group):
            del self._groups[stream.group_id]  # its last stream is gone: the id is free again
            self._precopies.forget(stream.group_id)
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
        """True while any stream is kept: a reservation pending, work unfinished, a reader
        attached, or a stream whose reader has not come yet (until its attach lease)."""
        return bool(self._streams)

    def begin_drain(self) -> None:
        """No new reservations, held pre-copies freed; streams end (reader_leases.py)."""
        self.draining = True
        self._leases.begin_drain(self._streams.get)
        self._precopies.expire_all()
        self._touch()

    async def wait_idle(self) -> None:
        """Return once no stream is kept (``busy`` is False): a drain's wait."""
        while self.busy():
            await self._changed.wait()

    async def retire(self) -> None:
        """Abort what is left, stop the event consumer and the receiver; the engine goes on
        (a role flip hands it to the other role, tandem/worker/dual/)."""
        if self._ae.alive:
            for rid in list(self._groups):
                await self.abort(rid)
        if self._events_task is not None:
            self._events_task.cancel()
        await self._receiver.close()
        await self._live_moves.close()

    async def close(self) -> None:
        """``retire``, then stop the engine thread."""
        await self.retire()
        await self._ae.shutdown()

