"""The engine on its own thread, for asyncio servers (the prefill and decode workers).

``LLMEngine`` is single-threaded: every call into it happens on one "engine thread", which
alternates between running queued calls and taking steps:

    asyncio tasks ──call(fn)──> [call queue] ──> engine thread: fn(engine); step(); step(); ...
                 <──future────                    │
    stream(rid) <──RequestOutput (per-request asyncio.Queue, buffered until read)──┘

A request's stream is opened inside the same engine-thread call that creates the request, so
no output can be produced before someone can receive it; outputs are buffered until read.

``stats()`` does not wait for a step: while one runs it answers with the counters the engine
thread took at that step's start (at most ``SNAPSHOT_EVERY_S`` apart). A prefill worker's
step of a long prompt runs seconds; its Stats used to wait for the step's end, the router's
probe gave up after a second and kept the worker's old step-cost fit, and with steps back to
back the probes fell mid-step every time: a router was measured placing on a 1.2
ms-a-token fit for 20 s while the worker's steps ran 2.8-3.3 ms a token (docs/placement.md).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tandem.engine.llm_engine import LLMEngine
from tandem.engine.outputs import EngineStats, RequestOutput
from tandem.engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)
T = TypeVar("T")

SNAPSHOT_EVERY_S = 0.1  # the engine thread's stats snapshots, taken at step starts, this apart
PAUSE_POLL_S = 0.01  # how often a paused engine thread asks its pause again (when no call comes)


class EngineDeadError(RuntimeError):
    """The engine thread stopped (shutdown or a failed step); no more work is taken."""


@dataclass(slots=True)
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[RequestOutput | BaseException]


class AsyncEngine:
    """Owns an ``LLMEngine`` and the thread that drives it.

    ``on_step(seconds)`` is called on the engine thread after every step that ran the model
    (the workers' step-time metric); ``on_busy(busy)`` there too, whenever the engine goes from
    idle to having work (True) or back (False), first with False at start (a prefill worker
    lending its idle cores: tandem/worker/core_lending.py). Both must be quick and thread-safe.
    ``pause(engine)``, if given, is asked there before every step: while it answers True the
    thread runs calls but takes no step (a test-only hold: tandem/worker/step_hold.py).
    """

    def __init__(
        self, engine: LLMEngine, on_step: Callable[[float], None] | None = None,
        on_busy: Callable[[bool], None] | None = None,
        pause: Callable[[LLMEngine], bool] | None = None,
    ) -> None:
        self.engine = engine
        self._pause = pause
        self._on_step = on_step if on_step is not None else _ignore_step
        self._on_busy = on_busy
        self._calls: queue.SimpleQueue[tuple[Callable[[LLMEngine], Any], Any] | None] = (
            queue.SimpleQueue()
        )
        self._streams: dict[str, _Stream] = {}
        self._dead: BaseException | None = None
        self._stepping = False  # the engine thread is inside a step
        self._snapshot: EngineStats | None = None  # stats() while it is (module docstring)
        self._snapshot_at = -SNAPSHOT_EVERY_S
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    # -- API for asyncio code ----------------------------------------------------------------
    async def call(
        self, fn: Callable[[LLMEngine], T], stream: str | Sequence[str] | None = None
    ) -> T:
        """Run ``fn(engine)`` on the engine thread between steps and return its result.

        With ``stream``, an output stream for that request id (or for each of several ids:
        the sequences of a forked request) is opened first, in the same critical section
        (read each with ``outputs``).
        """
        if self._dead is not None:
            raise EngineDeadError(str(self._dead))
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        names = [stream] if isinstance(stream, str) else list(stream or ())

        def job(engine: LLMEngine) -> Any:
            for name in names:
                self._streams[name] = _Stream(loop, asyncio.Queue())
            try:
                result = fn(engine)
            except BaseException:
                for name in names:
                    self._streams.pop(name, None)
                raise
            return result

        self._calls.put((job, (loop, fut)))
        return await fut

    async def stats(self) -> EngineStats:
        """The engine's counters: between steps, from the engine thread after the calls queued
        before this one; while a step runs, as of its start (or up to ``SNAPSHOT_EVERY_S``
        before it) rather than at its end (module docstring)."""
        snapshot = self._snapshot
        if self._stepping and snapshot is not None:
            return snapshot
        return await self.call(lambda e: e.stats())

    async def outputs(self, request_id: str) -> AsyncIterator[RequestOutput]:
        """Yield a request's outputs until its finished one (the stream must be open)."""
        stream = self._streams.get(request_id)
        if stream is None:
            raise KeyError(f"no open stream for {request_id!r}")
        while True:
            item = await stream.queue.get()
            if isinstance(item, BaseException):
                self._streams.pop(request_id, None)
                raise item
            if item.finished:
                self._streams.pop(request_id, None)
                yield item
                return
            yield item

    async def prepare(self, params: SamplingParams) -> None:
        """Work a request needs before it reaches the engine thread, done off it so steps are
        not held up: compiling its grammar (structured outputs) in the grammar engine's
        bounded pool, waiting at most its ``wait_s`` (the engine's own compile is then a
        lookup). Raises InvalidRequestError for a grammar that does not compile or ran past
        the compile budget, GrammarBusyError when it is not compiled in time."""
        grammars = self.engine.grammars
        if params.structured is not None and grammars is not None:
            await grammars.prepare(params.structured)

    def has_stream(self, request_id: str) -> bool:
        """True while a stream for the request is open (until its finished output is read)."""
        return request_id in self._streams

    def interrupt(self, request_id: str, exc: BaseException) -> None:
        """End a request's open stream after the outputs already delivered to it: its reader
        gets ``exc`` next (call on the event loop, after the engine call that stopped it)."""
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.queue.put_nowait(exc)

    def close_stream(self, request_id: str) -> None:
        """Forget a request's stream (after an abort whose output nobody will read)."""
        self._streams.pop(request_id, None)

    async def shutdown(self) -> None:
        """Stop the engine thread after the calls already queued, then the engine's other
        ranks (a tensor-parallel group)."""
        self._calls.put(None)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._thread.join)
        await loop.run_in_executor(None, self.engine.close)

    @property
    def alive(self) -> bool:
        """False once the engine thread has stopped."""
        return self._thread.is_alive() and self._dead is None

    # -- the engine thread -------------------------------------------------------------------
    def _run(self) -> None:
        was_busy: bool | None = None
        try:
            while True:
                busy = self.engine.has_unfinished()
                if busy != was_busy and self._on_busy is not None:
                    self._on_busy(busy)
                was_busy = busy
                paused = busy and self._pause is not None and self._pause(self.engine)
                try:
                    item = (self._calls.get(timeout=PAUSE_POLL_S) if paused
                            else self._calls.get(block=not busy))
                except queue.Empty:
                    item = ...
                if item is None:
                    break
                if item is not ...:
                    self._run_call(*item)
                    continue  # drain every queued call before the next step
                if paused:
                    continue
                steps, started = self.engine.num_steps, time.perf_counter()
                if started - self._snapshot_at >= SNAPSHOT_EVERY_S:
                    self._snapshot, self._snapshot_at = self.engine.stats(), started
                self._stepping = True
                try:
                    outputs = self.engine.step()
                finally:
                    self._stepping = False
                if self.engine.num_steps != steps:
                    self._on_step(time.perf_counter() - started)
                self._dispatch(outputs)
        except BaseException as exc:  # a failed step: fail every waiter, take no more work
            log.exception("engine loop died")
            self._dead = exc
            self._fail_all(exc)
        else:
            self._dead = EngineDeadError("engine shut down")
            self._fail_all(self._dead)

    def _run_call(self, job: Callable[[LLMEngine], Any], where: Any) -> None:
        loop, fut = where
        try:
            result = job(self.engine)
        except Exception as exc:  # the caller's error, not the engine's
            loop.call_soon_threadsafe(_set_exception, fut, exc)
        else:
            loop.call_soon_threadsafe(_set_result, fut, result)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, out)

    def _fail_all(self, exc: BaseException) -> None:
        # The event loop pops streams while this thread fails them: work on a copy (dict.copy
        # runs without releasing the GIL) and drop only the streams failed here.
        for request_id, stream in self._streams.copy().items():
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, EngineDeadError(str(exc)))
            self._streams.pop(request_id, None)
        while True:
            try:
                item = self._calls.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                loop, fut = item[1]
                loop.call_soon_threadsafe(_set_exception, fut, EngineDeadError(str(exc)))


def _ignore_step(seconds: float) -> None:
    """The default ``on_step``: nobody is measuring."""


def _set_result(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
