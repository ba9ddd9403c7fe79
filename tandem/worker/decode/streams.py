"""One request's messages on the decode worker, from Reserve to its last message.

    engine outputs (AsyncEngine stream, opened at Reserve) --pump--> queue --> StreamMessage
        --> Decode RPC (the servicer makes the protos)
    first token (COMMIT or local prefill): not streamed (the router has it from the prefill
        reply) but its text delta is carried into the next message, so the stream's texts
        concatenate to the whole completion
    external end (Abort, lease expiry, failed transfer): a final item, the pump stopped

Exactly one final item is queued: an output with ``finished`` set, or a ``WorkerError``.
A forked request has one stream per sequence (``index``; messages carry it), all under the
request's id (``group_id``) and its one transfer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable

from tandem.engine.async_engine import AsyncEngine, EngineDeadError
from tandem.engine.outputs import RequestOutput
from tandem.worker.decode.results import StreamMessage
from tandem.worker.errors import TransferEnded, WorkerError

StreamItem = RequestOutput | WorkerError


class RequestStream:
    """Buffers a request's outputs until its one reader (the Decode RPC) takes them."""

    def __init__(
        self,
        request_id: str,
        transfer_id: str,
        ae: AsyncEngine,
        on_end: Callable[[RequestStream], None],
        on_gap: Callable[[float], None] = lambda seconds: None,
        index: int = 0,
        group_id: str | None = None,
        moved_in: bool = False,
    ) -> None:
        """``request_id``: the engine's id of the sequence streamed (a forked request's
        sequence ``index`` of ``group_id``; else the request's own). ``transfer_id``: the tag
        of the push that fills the request's reservation (minted at Reserve; the engine's
        ledger knows it too). ``on_gap(seconds)``: the time between successive token outputs
        (ITL metric). ``moved_in``: a live move's target, whose first token (COMMIT's) the
        worker it moved from streamed already, text and all: its text is not sent again."""
        self.request_id = request_id
        self.transfer_id = transfer_id
        self.index = index
        self.group_id = group_id if group_id is not None else request_id
        self.attached = False  # a Decode RPC is reading
        self.ended = False  # the final item is queued
        self.started = False  # its first token is out (committed or prefilled here)
        self._ae = ae
        self._on_end = on_end
        self._queue: asyncio.Queue[StreamItem] = asyncio.Queue()
        self._pump: asyncio.Task[None] | None = None
        self._first: asyncio.Future[RequestOutput] | None = None
        self._text_prefix = ""
        self._on_gap = on_gap
        self._last_token_at = 0.0
        self._moved_in = moved_in
        self._under_way = asyncio.Event()  # set once started or ended

    def start(self) -> None:
        """Start moving the engine's outputs into the queue (the engine stream must be open)."""
        self._pump = asyncio.get_running_loop().create_task(self._run_pump())

    async def _run_pump(self) -> None:
        try:
            async for out in self._ae.outputs(self.request_id):
                if self._first is not None and not self._first.done():
                    self._first.set_result(out)
                    self.take_first(out)
                else:
                    self._timed(out)
                    self._put(out)
        except EngineDeadError as exc:
            self._put(TransferEnded(f"engine stopped: {exc}"))
        except WorkerError as exc:  # the engine stream was ended on purpose (a live move)
            self._put(exc)

    def expect_first(self) -> asyncio.Future[RequestOutput]:
        """The next engine output is the first token (local prefill): resolve it here."""
        self._first = asyncio.get_running_loop().create_future()
        return self._first

    def _timed(self, out: RequestOutput) -> None:
        if not out.new_token_ids:
            return
        now = time.monotonic()
        if self._last_token_at:
            self._on_gap(now - self._last_token_at)
        self._last_token_at = now

    def take_first(self, out: RequestOutput) -> None:
        """Account for the first token's output: keep its text; end if it was the last."""
        self.started = True
        self._under_way.set()
        self._last_token_at = time.monotonic()
        if not self._moved_in:
            self._text_prefix += out.new_text
        if out.finished:
            self._put(dataclasses.replace(out, new_token_ids=[], new_text="", logprobs=None))

    async def under_way(self) -> None:
        """Return once the first token is out (committed or prefilled here) or the stream
        ended: a reservation whose COMMIT is being applied is decoding a moment later."""
        await self._under_way.wait()

    def end(self, item: StreamItem) -> None:
        """End the stream from outside (abort, failed transfer); no-op once ended."""
        if self.ended:
            return
        if self._pump is not None and self._pump is not asyncio.current_task():
            self._pump.cancel()
        self._ae.close_stream(self.request_id)
        if self._first is not None and not self._first.done():
            self._first.set_exception(
                item if isinstance(item, WorkerError) else TransferEnded("request aborted")
            )
        self._put(item)

    def _put(self, item: StreamItem) -> None:
        if self.ended:
            return
        self._queue.put_nowait(item)
        if isinstance(item, WorkerError) or item.finished:
            self.ended = True
            self._under_way.set()
            self._on_end(self)

    async def messages(self) -> AsyncIterator[StreamMessage]:
        """Yield stream messages up to the last one; a final error item is raised."""
        while True:
            item = await self._queue.get()
            if isinstance(item, WorkerError):
                raise item
            msg = StreamMessage(item, self.index, self._text_prefix)
            self._text_prefix = ""
            yield msg
            if item.finished:
                return
