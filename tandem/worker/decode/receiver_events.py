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
        """Apply every event the receiver reports, one after another, for as long as it runs."""
        while True:
            event = await self._receiver.events.get()
            self._taken += 1
            try:
                await self._on_event(event)
            except Exception:  # a bug in one request's handling must not stop every commit
                log.exception("handling %r failed", event)
            finally:
                self._applied += 1
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

    async def _on_event(self, event: TransferEvent) -> None:
        tid = event.transfer_id
        if self._agents is not None:  # ended here: the other ranks' leases end too
            self._agents.release(tid)
        if isinstance(event, Committed):
            try:
                outs = await self._ae.call(
                    lambda e: e.remote.decode.commit_forked(tid, event.first_tokens,
                                                            event.first_logprobs)
                )
            except Exception as exc:  # a first token outside the vocabulary, a wrong count
                self._count_commit(event)
                await self.end(tid, TransferEnded(f"commit refused: {exc}"))
                return
            if outs is None:  # already ended here (Abort, PrefillLocal) while it was queued
                log.debug("commit for a reservation already ended: %r", event)
                return
            self._count_commit(event)
            for out in outs:  # one per sequence of a forked request
                stream = self._streams.get(out.request_id)
                if stream is not None:
                    stream.take_first(out)
                    self._await_reader(stream)
        elif isinstance(event, Expired):
            await self.end(tid, TransferEnded("lease expired before the KV arrived"))
        elif isinstance(event, Aborted):
            await self.end(tid, TransferEnded(
                f"KV transfer aborted by the {event.by} ({event.code}): {event.reason}"))

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
