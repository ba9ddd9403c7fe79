"""The pool's start-up supervision without Ray running: every "failed to start" names its
cause (the worker's exception, the pool being stopped, or the time it did not report in).

Fake actor handles stand in for Ray's: ``handle.method.remote(...)`` returns an awaitable,
as an ``ObjectRef`` is one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tandem.launcher.pool import PoolActor, _Worker, start_failure
from tandem.launcher.spec import LaunchSpec

pytest.importorskip("ray")
from ray.exceptions import RayTaskError  # noqa: E402


class _Method:
    def __init__(self, fn: Callable[..., Awaitable[Any]]) -> None:
        self._fn = fn

    def remote(self, *args: Any) -> Awaitable[Any]:
        return self._fn(*args)


class _Handle:
    """A worker actor whose ``ready`` does what the test says; ``drain`` returns at once."""

    def __init__(self, ready: Callable[..., Awaitable[Any]]) -> None:
        self.ready = _Method(ready)
        self.signals = _Method(self._signals)
        self.drain = _Method(self._drain)
        self.drained = asyncio.Event()

    async def _signals(self) -> dict[str, Any]:
        await asyncio.Event().wait()  # serving: the watcher polls until cancelled
        return {}

    async def _drain(self) -> int:
        self.drained.set()
        return 0


def _pool(*readies: Callable[..., Awaitable[Any]]) -> PoolActor:
    pool = PoolActor(LaunchSpec(insecure=True, dead_after_s=0.5), "model")
    for i, ready in enumerate(readies):
        w = _Worker("decode", i, _Handle(ready), None)
        w.watcher = asyncio.create_task(pool._watch(w))
        pool._workers.append(w)
    return pool


async def _cancel_watchers(pool: PoolActor) -> None:
    for w in pool._workers:
        if w.watcher is not None:
            w.watcher.cancel()
    await asyncio.gather(*(w.watcher for w in pool._workers if w.watcher),
                         return_exceptions=True)


async def _serves(timeout_s: float = 600.0) -> dict[str, Any]:
    return {"grpc": "127.0.0.1:1", "worker_id": "decode-1", "registered": True}


async def _never(timeout_s: float = 600.0) -> dict[str, Any]:
    await asyncio.Event().wait()
    return {}


def _raises(exc: BaseException) -> Callable[..., Awaitable[Any]]:
    async def ready(timeout_s: float = 600.0) -> dict[str, Any]:
        raise exc

    return ready


def _start_error(*behaviours: Callable[..., Awaitable[Any]], timeout_s: float = 10) -> str:
    """The RuntimeError a start of workers with ``behaviours`` ends with, as text."""
    async def main() -> str:
        pool = _pool(*behaviours)
        try:
            with pytest.raises(RuntimeError) as err:
                await pool._wait_serving(timeout_s)
            return str(err.value)
        finally:
            await _cancel_watchers(pool)

    return asyncio.run(main())


def test_a_worker_that_raises_names_its_exception() -> None:
    """What Ray hands back for a worker whose start raised: the wrapped exception's text."""
    cause = ValueError("no model at /nowhere")
    wrapped = RayTaskError("WorkerActor.ready", "Traceback ...\nValueError: ...", cause)

    message = _start_error(_serves, _raises(wrapped))
    assert message == "tandem-decode-1 failed to start: ValueError: no model at /nowhere"


def test_an_unexpected_error_in_the_supervisor_is_the_cause_not_a_hang() -> None:
    """An exception Ray does not wrap (neither a task nor an actor error) used to end the
    watcher silently, leaving the worker 'starting' until the ready timeout."""
    message = _start_error(_raises(OSError("connection reset")))
    assert "tandem-decode-0 failed to start" in message and "connection reset" in message


def test_a_worker_that_never_reports_names_the_wait() -> None:
    message = _start_error(_serves, _never, timeout_s=0.3)
    assert message == "tandem-decode-1 did not report in 0.3 s (still starting)"


def test_stopping_the_pool_during_start_says_so() -> None:
    """``down()`` while ``start()`` waits: the retired workers end 'dead' with no error of
    their own, which read "failed to start: None"; now the start says it was cancelled and a
    retired worker carries why it ended."""
    async def main() -> tuple[str, str]:
        pool = _pool(_never)
        waiting = asyncio.create_task(pool._wait_serving(10))
        worker = pool._workers[0]
        stopped = await pool.down()
        assert stopped["stopped"] == ["tandem-decode-0"]
        with pytest.raises(RuntimeError) as err:
            await waiting
        return str(err.value), start_failure(worker)

    message, retired = asyncio.run(main())
    assert message == "start cancelled: the cluster is being stopped"
    assert retired == ("tandem-decode-0 failed to start: drained and stopped by the pool "
                       "before it served")
    assert "None" not in retired


def test_start_failure_never_reads_none() -> None:
    w = _Worker("prefill", 3, object(), None, state="dead")
    assert start_failure(w) == ("tandem-prefill-3 failed to start: it ended in state 'dead' "
                                "without an error")
