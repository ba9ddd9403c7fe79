"""The engine on its own thread, for asyncio servers (the prefill and decode workers).

``LLMEngine`` is single-threaded: every call into it happens on one "engine thread", which
alternates between running queued calls and taking steps:

    asyncio tasks ──call(fn)──> [call queue] ──> engine thread: fn(engine); step(); step(); ...
                 <──future────                    │
    stream(rid) <──RequestOutput (per-request asyncio.Queue, buffered until read)──┘

Calls run in the order they were queued, every queued one before the next step: ``submit``
queues one without waiting (what is queued after it runs after it), ``call`` waits for its
result too.

The engine's bookkeeping (requests, blocks, the prefix cache, the reservation ledger) is
guarded by one lock, held by the engine thread throughout except while it waits for work and
inside the model's forward (``ModelRunner.forward_window``: the forward reads only tensors and
the step's inputs, built before it)::

    engine thread: [calls][schedule] forward [sample, append][calls][schedule] forward ...
    lock:           held  held       free    held            held  held       free

``submit_now`` (``call_now``) runs a call on the caller's thread at once when it gets the
lock and nothing queued is still to run ahead of it: a decode worker's Reserve, or a commit
of pushed KV, then does not wait for the step in flight.

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
import contextlib
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tandem.engine.llm_engine import LLMEngine
from tandem.engine.loop_delivery import LoopDelivery
from tandem.engine.outputs import EngineStats, RequestOutput
from tandem.engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)
T = TypeVar("T")

SNAPSHOT_EVERY_S = 0.1  # the engine thread's stats snapshots, taken at step starts, this apart
PAUSE_POLL_S = 0.01  # how often a paused engine thread asks its pause again (when no call comes)


_WAKE = object()  # queued by submit_now for an engine thread waiting for work: look again


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
        # (job, (loop, future)) each; None: stop; _WAKE: look for work again
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        # the bookkeeping lock (module docstring); taken by the engine thread in _run
        self._book = threading.Lock()
        self._counted = threading.Lock()  # guards _submitted (callers may be on any thread)
        self._submitted = 0  # calls queued so far
        self._ran = 0  # calls the engine thread has run (written under _book only)
        self._waiting = False  # the engine thread waits for a call, no step to take (_book)
        engine.runner.forward_window = self._forward_window
        self._dead: BaseException | None = None
        self._stepping = False  # the engine thread is inside a step
        self._snapshot: EngineStats | None = None  # stats() while it is (module docstring)
        self._snapshot_at = -SNAPSHOT_EVERY_S
        self._delivery = LoopDelivery()  # the engine thread's results reach their loops
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
        return await self.submit(fn, stream)

    def submit(
        self, fn: Callable[[LLMEngine], T], stream: str | Sequence[str] | None = None
    ) -> asyncio.Future[T]:
        """``call`` without waiting: ``fn`` is queued on return (calls run in the order they
        were queued, every queued one before the next step), its result the future's.
        Call on the event loop. Raises EngineDeadError."""
        if self._dead is not None:
            raise EngineDeadError(str(self._dead))
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        with self._counted:  # counted before it can run: _ran never passes _submitted
            self._submitted += 1
            self._calls.put((self._job(fn, stream, loop), (loop, fut)))
        return fut

    def submit_now(
        self, fn: Callable[[LLMEngine], T], stream: str | Sequence[str] | None = None
    ) -> asyncio.Future[T]:
        """``submit``, but run on this thread at once (its result then follows the engine
        thread's earlier hand-overs to the loop) when the engine thread is outside its
        bookkeeping (waiting for work, or inside the model's forward) and every call queued
        before has run. Either way ``fn`` runs after every
        call queued before it and never beside the engine thread's bookkeeping (module
        docstring). Call on the event loop. Raises EngineDeadError.

        ``fn`` may touch the bookkeeping only, and no request a step has scheduled: the
        reservations' transitions (reserve, commit, end) qualify. The forward it may overlap
        reads no bookkeeping and no free block; the step's own bookkeeping, before and after
        the forward, holds the lock; so does every call."""
        loop = asyncio.get_running_loop()
        if self._dead is None and self._book.acquire(blocking=False):
            try:
                if self._ran == self._submitted:  # nothing queued is still to run
                    fut: asyncio.Future[T] = loop.create_future()
                    # The result goes the way the engine thread's do, so it reaches the loop
                    # after the outputs and results that thread handed over before it.
                    try:
                        self._delivery.send(loop, _set_result, fut,
                                            self._job(fn, stream, loop)(self.engine))
                    except Exception as exc:  # the caller's error, as a call's
                        self._delivery.send(loop, _set_exception, fut, exc)
                    if self._waiting:  # it may have given the steps work: look again
                        self._calls.put(_WAKE)
                    return fut
            finally:
                self._book.release()
        return self.submit(fn, stream)

    async def call_now(
        self, fn: Callable[[LLMEngine], T], stream: str | Sequence[str] | None = None
    ) -> T:
        """``submit_now``, waiting for the result."""
        return await self.submit_now(fn, stream)

    def _job(self, fn: Callable[[LLMEngine], T], stream: str | Sequence[str] | None,
             loop: asyncio.AbstractEventLoop) -> Callable[[LLMEngine], T]:
        """``fn`` with the streams named by ``stream`` opened first, in the same critical
        section (dropped again if it raises)."""
        names = [stream] if isinstance(stream, str) else list(stream or ())

        def job(engine: LLMEngine) -> T:
            for name in names:
                self._streams[name] = _Stream(loop, asyncio.Queue())
            try:
                return fn(engine)
            except BaseException:
                for name in names:
                    self._streams.pop(name, None)
                raise

        return job

    def pending_calls(self) -> int:
        """Calls queued that the engine thread has not taken yet, wake-ups included
        (approximate while it runs; exact while it is held inside a call or a forward, as a
        test's forced ordering holds it)."""
        return self._calls.qsize()

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

    def deliver(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
        """Engine thread (an engine hook): run ``fn(*args)`` on ``loop``, in order with the
        outputs and results this thread hands over (tandem/engine/loop_delivery.py: without
        giving up the GIL, so the step goes on while the loop wakes)."""
        self._delivery.send(loop, fn, *args)

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
        self._book.acquire()  # held from here on but while waiting and in the forward; kept
        try:                  # when the thread ends (call_now then finds it dead or taken)
            while True:
                busy = self.engine.has_unfinished()
                if busy != was_busy and self._on_busy is not None:
                    self._on_busy(busy)
                was_busy = busy
                paused = busy and self._pause is not None and self._pause(self.engine)
                try:
                    item = self._take(busy, paused)
                except queue.Empty:
                    item = ...
                if item is None:
                    break
                if item is _WAKE:  # a call_now gave it work, maybe
                    continue
                if item is not ...:
                    self._run_call(*item)
                    self._ran += 1
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
        finally:
            self._delivery.close()  # what was handed over reaches its loop, then it ends

    def _take(self, busy: bool, paused: bool) -> Any:
        """The next queued call (raises queue.Empty): at once while there are steps to take,
        else waiting for one (at most ``PAUSE_POLL_S`` while paused), the lock free then."""
        if busy and not paused:
            return self._calls.get_nowait()
        self._waiting = not paused  # a paused thread looks again on its own
        self._book.release()
        try:
            return self._calls.get(timeout=PAUSE_POLL_S) if paused else self._calls.get()
        finally:
            self._book.acquire()
            self._waiting = False

    @contextlib.contextmanager
    def _forward_window(self) -> Iterator[None]:
        """Around the model's forward: the lock is free meanwhile (on this engine thread
        only; an engine stepped from elsewhere holds no lock of this one's)."""
        if threading.current_thread() is not self._thread:
            yield
            return
        self._book.release()
        try:
            yield
        finally:
            self._book.acquire()

    def _run_call(self, job: Callable[[LLMEngine], Any], where: Any) -> None:
        loop, fut = where
        try:
            result = job(self.engine)
        except Exception as exc:  # the caller's error, not the engine's
            self._delivery.send(loop, _set_exception, fut, exc)
        else:
            self._delivery.send(loop, _set_result, fut, result)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            self._delivery.send(stream.loop, stream.queue.put_nowait, out)

    def _fail_all(self, exc: BaseException) -> None:
        # The event loop pops streams while this thread fails them: work on a copy (dict.copy
        # runs without releasing the GIL) and drop only the streams failed here.
        for request_id, stream in self._streams.copy().items():
            self._delivery.send(stream.loop, stream.queue.put_nowait,
                                EngineDeadError(str(exc)))
            self._streams.pop(request_id, None)
        while True:
            try:
                item = self._calls.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, tuple):
                loop, fut = item[1]
                self._delivery.send(loop, _set_exception, fut, EngineDeadError(str(exc)))


def _ignore_step(seconds: float) -> None:
    """The default ``on_step``: nobody is measuring."""


def _set_result(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
