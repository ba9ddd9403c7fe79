"""What a decode worker's KV receiver reports, applied to its engine and to the streams
waiting on it.

    Committed ──> the engine takes the request's first token(s) (commit_forked); each of its
                  sequences' streams gets its first token and waits for its reader
    Expired, Aborted, a refused commit ──> the engine ends the reservation; its streams end
                  with the reason

Either way a tensor-parallel group's other ranks end their leases on the same blocks.

A Reserve waits until the events reported so far are applied (``caught_up``): a commit the
receiver has acknowledged is then in the engine, its full blocks prefix-cached, so a forked
request's next sequence moving here finds its prompt's blocks (tandem/router/handoff/ledger.py
moves them one at a time).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence

from tandem.engine.async_engine import AsyncEngine
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
        self._taken = self._applied = 0  # events taken off the queue, and applied since
        self._handled = asyncio.Event()  # set (and replaced) after each event

    async def consume(self) -> None:
        """Apply every event the receiver reports, for as long as it runs: those queued
        together at once, their commits in one engine call (none waits a step behind
        another's: a burst of handoffs or of live moves lands in one step)."""
        events = self._receiver.events
        while True:
            batch = [await events.get()]
            while not events.empty():
                batch.append(events.get_nowait())
            self._taken += len(batch)
            try:
                await self._apply(batch)
            except Exception:  # a bug in one request's handling must not stop every commit
                log.exception("handling %r failed", batch)
            finally:
                self._applied += len(batch)
                handled, self._handled = self._handled, asyncio.Event()
                handled.set()

    async def caught_up(self) -> None:
        """Return once every event the receiver has reported so far is applied (those
        reported later are not waited for)."""
        reported = self._taken + self._receiver.events.qsize()
        while self._applied < reported:
            await self._handled.wait()

    def release(self, tid: str, reason: str) -> None:
        """End a reservation's lease here and on every other rank of the group."""
        self._receiver.release(tid, reason)
        if self._agents is not None:
            self._agents.release(tid)

    async def _apply(self, batch: list[TransferEvent]) -> None:
        if self._agents is not None:  # ended here: the other ranks' leases end too
            for event in batch:
                self._agents.release(event.transfer_id)
        commits = [event for event in batch if isinstance(event, Committed)]
        if commits:
            results = await self._ae.call(lambda e: [_commit(e, c) for c in commits])
            for event, result in zip(commits, results, strict=True):
                await self._committed(event, result)
        for event in batch:
            if isinstance(event, Expired):
                await self.end(event.transfer_id,
                               TransferEnded("lease expired before the KV arrived"))
            elif isinstance(event, Aborted):
                await self.end(event.transfer_id, TransferEnded(
                    f"KV transfer aborted by the {event.by} ({event.code}): {event.reason}"))

    async def _committed(self, event: Committed,
                         result: list[RequestOutput] | Exception | None) -> None:
        if isinstance(result, Exception):  # a first token outside the vocabulary, a count
            self._count_commit(event)
            await self.end(event.transfer_id, TransferEnded(f"commit refused: {result}"))
        elif result is None:  # already ended here (Abort, PrefillLocal) while it was queued
            log.debug("commit for a reservation already ended: %r", event)
        else:
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
        if out is None:
            log.debug("transfer %s ended after its reservation: %s", transfer_id, why)
            return
        log.info("request %s ended before decoding: %s", out.request_id, why)
        for stream in self._groups.get(out.request_id, ()):  # every sequence it was to fork
            stream.end(why)


def _commit(engine: LLMEngine, event: Committed) -> list[RequestOutput] | Exception | None:
    """One commit on the engine thread; its error is returned, so the others still apply."""
    try:
        return engine.remote.decode.commit_forked(event.transfer_id, event.first_tokens,
                                                  event.first_logprobs)
    except Exception as exc:  # the caller ends that one reservation
        return exc
