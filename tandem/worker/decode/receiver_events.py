"""What a decode worker's KV receiver reports, applied to its engine and to the streams
waiting on it.

    Committed ──> the engine takes the request's first token(s) (commit_forked); each of its
                  sequences' streams gets its first token and waits for its reader
    Expired, Aborted, a refused commit ──> the engine ends the reservation; its streams end
                  with the reason

Either way a tensor-parallel group's other ranks end their leases on the same blocks.

Each event's engine work (the commit, or the end) is done the moment the event is taken off
the receiver's queue: at once beside the forward of a step in flight (or an idle engine), or
queued on the engine when its thread is in its bookkeeping or a call is queued ahead
(``AsyncEngine.submit_now``), never behind the reply to an earlier event: every event
reported during a step applies before the next step, however many arrive (a burst of
handoffs or of live moves lands in one step). Its outcome (the streams' first tokens, or
their end) is handled when the engine work is done::

    receiver.events ──take (consume, or take_reported)──> engine work, now or queued at once
                                                          └──> done: streams fed or ended

A Reserve takes every event reported so far (``take_reported``) just before its own engine
work, with no await between: the engine runs its work in the order submitted, so a commit
the receiver has acknowledged is in the engine, its full blocks prefix-cached, when the
reservation looks for its prompt's blocks (a forked request's next sequence moving here
finds them: tandem/router/handoff/ledger.py moves them one at a time), without the Reserve
waiting for a step to apply it first.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence

from tandem.engine.async_engine import AsyncEngine, EngineDeadError
from tandem.engine.llm_engine import LLMEngine
from tandem.engine.outputs import RequestOutput
from tandem.kv_transfer import Aborted, Committed, Expired, Receiver, TransferEvent
from tandem.worker.decode.streams import RequestStream
from tandem.worker.errors import TransferEnded
from tandem.worker.metrics import WorkerMetrics
from tandem.worker.tp_group import GroupAgents

log = logging.getLogger(__name__)


class ReceiverEvents:
    """The receiver's events for one decode worker: ``streams`` by sequence id and ``groups``
    (a request's streams) are the worker's own tables, read here; ``await_reader`` starts a
    stream's wait for its Decode call."""

    def __init__(self, ae: AsyncEngine, receiver: Receiver, agents: GroupAgents | None,
                 metrics: WorkerMetrics, streams: Mapping[str, RequestStream],
                 groups: Mapping[str, Sequence[RequestStream]],
                 await_reader: Callable[[RequestStream], None]) -> None:
        self._ae = ae
        self._receiver = receiver
        self._agents = agents
        self._metrics = metrics
        self._streams = streams
        self._groups = groups
        self._await_reader = await_reader
        self._outcomes: set[asyncio.Task[None]] = set()  # engine work submitted, unhandled

    async def consume(self) -> None:
        """Do (or queue) every event's engine work as the receiver reports it, for as long
        as it runs (those reported together in one engine call)."""
        events = self._receiver.events
        while True:
            first = await events.get()
            try:
                self._queue([first, *self._take()])
            except Exception:  # a bug in one batch's handling must not stop every commit
                log.exception("queueing transfer events failed")

    def take_reported(self) -> None:
        """Do (or queue) the engine work of every event the receiver has reported so far:
        engine work submitted after this returns runs after it (those reported later are
        not taken)."""
        self._queue(self._take())

    def release(self, tid: str, reason: str) -> None:
        """End a reservation's lease here and on every other rank of the group."""
        self._receiver.release(tid, reason)
        if self._agents is not None:
            self._agents.release(tid)

    def _take(self) -> list[TransferEvent]:
        events = self._receiver.events
        batch: list[TransferEvent] = []
        while not events.empty():
            batch.append(events.get_nowait())
        return batch

    def _queue(self, batch: list[TransferEvent]) -> None:
        if not batch:
            return
        if self._agents is not None:  # ended here: the other ranks' leases end too
            for event in batch:
                self._agents.release(event.transfer_id)
        try:
            done = self._ae.submit_now(lambda e: [_apply(e, event) for event in batch])
        except EngineDeadError:
            log.warning("engine stopped: %d transfer events not applied", len(batch))
            return
        task = asyncio.get_running_loop().create_task(self._handle(batch, done))
        self._outcomes.add(task)
        task.add_done_callback(self._outcomes.discard)

    async def _handle(self, batch: list[TransferEvent],
                      done: asyncio.Future[list[_Applied]]) -> None:
        try:
            results = await done
        except Exception:  # the engine stopped: every stream waiting on it fails with it
            log.exception("applying %r failed", batch)
            return
        for event, result in zip(batch, results, strict=True):
            try:
                if isinstance(event, Committed):
                    await self._committed(event, result)
                elif isinstance(event, Expired):
                    self._ended(event.transfer_id, result,
                                TransferEnded("lease expired before the KV arrived"))
                elif isinstance(event, Aborted):
                    self._ended(event.transfer_id, result, TransferEnded(
                        f"KV transfer aborted by the {event.by} ({event.code}): "
                        f"{event.reason}"))
            except Exception:  # a bug in one request's handling must not stop the others
                log.exception("handling %r failed", event)

    async def _committed(self, event: Committed, result: _Applied) -> None:
        if isinstance(result, Exception):  # a first token outside the vocabulary, a count
            self._count_commit(event)
            await self.end(event.transfer_id, TransferEnded(f"commit refused: {result}"))
        elif result is None:  # already ended here (Abort, PrefillLocal) while it was queued
            log.debug("commit for a reservation already ended: %r", event)
        else:
            assert isinstance(result, list)
            self._count_commit(event)
            for out in result:  # one per sequence of a forked request
                stream = self._streams.get(out.request_id)
                if stream is not None:
                    stream.take_first(out)
                    self._await_reader(stream)

    def _count_commit(self, event: Committed) -> None:
        layout = self._receiver.layout
        self._metrics.transfer_committed(
            layout.payload_bytes(layout.num_layers, len(event.block_ids)), event.seconds)

    async def end(self, transfer_id: str, why: TransferEnded) -> None:
        """A transfer that will not commit: the engine frees its reservation, if still live."""
        out = await self._ae.call(lambda e: e.remote.decode.end(transfer_id))
        self._ended(transfer_id, out, why)

    def _ended(self, transfer_id: str, out: _Applied, why: TransferEnded) -> None:
        """The engine's answer to ending a reservation: its final output, None (it had ended
        already), or the error ending it raised (logged where it was raised: the request's
        streams still end, so no reader waits on a reservation that is gone)."""
        if isinstance(out, Exception):
            for group in list(self._groups.values()):
                if group and group[0].transfer_id == transfer_id:
                    for stream in group:
                        stream.end(why)
            return
        if not isinstance(out, RequestOutput):
            log.debug("transfer %s ended after its reservation: %s", transfer_id, why)
            return
        log.info("request %s ended before decoding: %s", out.request_id, why)
        for stream in self._groups.get(out.request_id, ()):  # every sequence it was to fork
            stream.end(why)


_Applied = list[RequestOutput] | RequestOutput | Exception | None  # one event's outcome


def _apply(engine: LLMEngine, event: TransferEvent) -> _Applied:
    """One event's engine work on the engine thread: a commit's outputs, or an ended
    reservation's final output (either one's error is returned, so the others still apply)."""
    if isinstance(event, Committed):
        try:
            return engine.remote.decode.commit_forked(event.transfer_id, event.first_tokens,
                                                      event.first_logprobs)
        except Exception as exc:  # the caller ends that one reservation
            return exc
    try:
        return engine.remote.decode.end(event.transfer_id)  # Aborted, Expired
    except Exception as exc:  # logged; the batch's other events still apply and are answered
        log.exception("ending reservation %s failed", event.transfer_id)
        return exc
