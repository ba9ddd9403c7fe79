"""Grammar compiles one at a time, each held to a CPU-time budget, off every other thread.

    submit(key, fn) ─> queue (at most ``max_queued``; one job per key in flight) ─> dispatcher
    dispatcher: runs each job on a fresh daemon thread (niced), and watches its CPU time:
        done within ``budget_s`` CPU seconds ─> the job's future gets fn's result (or error)
        past the budget                      ─> the future gets ``CompileOverBudget`` at once;
                                                the thread is left to finish, its result dropped

xgrammar's compile is one C++ call that cannot be interrupted; it releases the GIL and runs on
the calling thread, so the engine thread and the event loop keep running beside it and the
thread's own CPU clock measures exactly its work. A compile that ran past its budget is left to
finish on its thread (no process to kill: a compiled grammar would have to be serialized back,
megabytes for a large vocabulary). The dispatcher starts a job only while fewer than
``max_overrun`` runaways live, so at most ``max_overrun`` compile threads ever run, runaways
included: with the default of two, one runaway and the compile after it (a second runaway
holds the queue until one of them ends). Compile threads run at nice ``COMPILE_NICE``: under
contention the engine's threads get the CPU first.

The budget is CPU time, not wall time, so whether a grammar is refused does not depend on how
busy the machine was: a refusal can be cached. How long a request waits is its caller's
business (``GrammarEngine.prepare``): a compile still queued or starved of CPU when the wait
ends is not refused, only not ready yet.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

COMPILE_NICE = 10  # a nice-0 thread gets ~10x the CPU of one at nice 10 on a shared core
_MIN_POLL_S = 0.01


class CompileOverBudget(Exception):
    """A compile used more CPU time than the budget allows (its thread is left to finish)."""


class CompilerBusy(Exception):
    """The compile queue is full: nothing was queued."""


@dataclass(slots=True)
class _Job:
    key: str
    fn: Callable[[], Any]
    future: Future[Any] = field(default_factory=Future)


class CompilePool:
    """A queue of compile jobs run one at a time, each within ``budget_s`` CPU seconds;
    ``max_queued`` jobs may wait, ``max_overrun`` compile threads may run (runaways included)."""

    def __init__(self, budget_s: float, max_queued: int = 16, max_overrun: int = 2,
                 name: str = "grammar-compile") -> None:
        if budget_s <= 0 or max_queued < 1 or max_overrun < 1:
            raise ValueError("budget_s must be > 0, max_queued and max_overrun >= 1")
        self.budget_s = budget_s
        self.max_queued = max_queued
        self.max_overrun = max_overrun
        self._name = name
        self._cond = threading.Condition()
        self._queue: deque[_Job] = deque()
        self._inflight: dict[str, _Job] = {}  # queued or running, by key
        self._overrun: set[threading.Thread] = set()  # past their budget, still running
        self._closed = False
        self._dispatcher: threading.Thread | None = None
        self.started = 0  # compiles started (each job once)
        self.over_budget = 0  # of which refused for running past the budget

    def submit(self, key: str, fn: Callable[[], Any]) -> Future[Any]:
        """The future of ``fn()`` run under the budget; a job already queued or running for
        ``key`` is shared, not run again. Raises CompilerBusy when ``max_queued`` jobs wait."""
        with self._cond:
            if self._closed:
                raise RuntimeError("compile pool is closed")
            job = self._inflight.get(key)
            if job is not None:
                return job.future
            if len(self._queue) >= self.max_queued:
                raise CompilerBusy(f"{len(self._queue)} grammar compiles already queued")
            job = _Job(key, fn)
            self._inflight[key] = job
            self._queue.append(job)
            if self._dispatcher is None:
                self._dispatcher = threading.Thread(target=self._dispatch, daemon=True,
                                                    name=f"{self._name}-dispatch")
                self._dispatcher.start()
            self._cond.notify_all()
            return job.future

    @property
    def overrunning(self) -> int:
        """Compile threads past their budget that have not finished yet."""
        with self._cond:
            self._overrun = {t for t in self._overrun if t.is_alive()}
            return len(self._overrun)

    def close(self) -> None:
        """Refuse new jobs and fail the queued ones; a running compile finishes on its own."""
        with self._cond:
            self._closed = True
            while self._queue:
                job = self._queue.popleft()
                self._inflight.pop(job.key, None)
                job.future.set_exception(RuntimeError("compile pool closed"))
            self._cond.notify_all()

    # -- the dispatcher thread ------------------------------------------------------------
    def _dispatch(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (
                    not self._queue or len(self._live_overrun()) >= self.max_overrun
                ):
                    # an overrun thread's end is not signalled: look again now and then
                    self._cond.wait(timeout=0.1 if self._queue else None)
                if self._closed:
                    return
                job = self._queue.popleft()
            try:
                self._run(job)
            finally:
                with self._cond:
                    self._inflight.pop(job.key, None)

    def _live_overrun(self) -> set[threading.Thread]:
        self._overrun = {t for t in self._overrun if t.is_alive()}
        return self._overrun

    def _run(self, job: _Job) -> None:
        if not job.future.set_running_or_notify_cancel():
            return
        outcome: list[tuple[bool, Any]] = []  # (ok, value), set by the compile thread

        def work() -> None:
            _lower_priority()
            try:
                outcome.append((True, job.fn()))
            except BaseException as exc:  # handed to the future, never lost
                outcome.append((False, exc))

        thread = threading.Thread(target=work, daemon=True, name=f"{self._name}-run")
        self.started += 1
        thread.start()
        clock = _cpu_clock(thread)
        wall_start = time.monotonic()
        while True:
            used = _cpu_seconds(clock, wall_start)
            if used >= self.budget_s:
                break
            # CPU time never runs ahead of wall time: wait at least what is left of the budget
            thread.join(max(self.budget_s - used, _MIN_POLL_S))
            if not thread.is_alive():
                break
        if thread.is_alive():  # over the budget: leave it to finish, refuse now
            with self._cond:
                self._overrun.add(thread)
            self.over_budget += 1
            log.warning("grammar compile %s... refused: over its %.1f s CPU budget "
                        "(its thread finishes on its own)", job.key[:12], self.budget_s)
            job.future.set_exception(CompileOverBudget(
                f"took more than the {self.budget_s:g} s compile budget"))
            return
        ok, value = outcome[0]
        if ok:
            job.future.set_result(value)
        else:
            job.future.set_exception(value)


def _lower_priority() -> None:
    """Nice the calling thread to at least COMPILE_NICE (Linux: a thread id is a process id to
    setpriority); elsewhere, or when refused, it runs at the process's priority."""
    try:
        tid = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, tid)
        if current < COMPILE_NICE:
            os.setpriority(os.PRIO_PROCESS, tid, COMPILE_NICE)
    except (AttributeError, OSError):
        pass


def _cpu_clock(thread: threading.Thread) -> int | None:
    """The thread's CPU-time clock (POSIX), or None where there is none."""
    try:
        assert thread.ident is not None
        return time.pthread_getcpuclockid(thread.ident)
    except (AttributeError, OSError):
        return None


def _cpu_seconds(clock: int | None, wall_start: float) -> float:
    """CPU seconds the compile thread has used (wall seconds where no CPU clock exists; 0 once
    the thread has ended, the caller then sees it done)."""
    if clock is None:
        return time.monotonic() - wall_start
    try:
        return time.clock_gettime(clock)
    except OSError:  # the thread has just ended
        return 0.0
