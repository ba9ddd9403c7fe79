"""The in-flight tracker alone: a cut call raises CallCutError, a cancelled task stays
cancelled, and nothing stays tracked after its block."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any

import pytest

from tandem.router.handoff.inflight import CallCutError, InflightCalls


class FakeCall:
    """A call that never answers; cancel() ends it as a cancelled grpc.aio call does."""

    def __init__(self) -> None:
        self.future: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def cancel(self) -> bool:
        return self.future.cancel()

    def __await__(self) -> Generator[Any, None, str]:
        return self.future.__await__()


async def _tracked(inflight: InflightCalls, endpoint: str, call: FakeCall) -> str:
    with inflight.track(endpoint, call):
        return await call


def test_a_cut_call_raises_call_cut_error() -> None:
    async def scenario() -> None:
        inflight = InflightCalls()
        calls = [FakeCall(), FakeCall()]
        tasks = [asyncio.ensure_future(_tracked(inflight, "d:1", c)) for c in calls]
        other = FakeCall()
        spared = asyncio.ensure_future(_tracked(inflight, "d:2", other))
        await asyncio.sleep(0)  # every task is inside its block
        assert inflight.count("d:1") == 2 and inflight.count("d:2") == 1
        assert inflight.cancel("d:1", "probe failed") == 2
        for task in tasks:
            with pytest.raises(CallCutError, match="probe failed") as err:
                await task
            assert err.value.endpoint == "d:1"
        assert inflight.count("d:1") == 0 and inflight.cut == 2
        assert not spared.done()  # another endpoint's call goes on
        other.future.set_result("ok")
        assert await spared == "ok"
        assert inflight.count("d:2") == 0 and inflight.cancel("d:2", "late") == 0

    asyncio.run(scenario())


def test_a_task_cancelled_while_its_call_is_cut_stays_cancelled() -> None:
    """The client went away at the same moment: the request is cancelled, not failed."""

    async def scenario() -> None:
        inflight = InflightCalls()
        call = FakeCall()
        task = asyncio.ensure_future(_tracked(inflight, "d:1", call))
        await asyncio.sleep(0)
        inflight.cancel("d:1", "probe failed")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert inflight.count("d:1") == 0

    asyncio.run(scenario())


def test_a_plain_cancellation_is_not_a_cut() -> None:
    async def scenario() -> None:
        inflight = InflightCalls()
        call = FakeCall()
        task = asyncio.ensure_future(_tracked(inflight, "d:1", call))
        await asyncio.sleep(0)
        call.cancel()  # cancelled by someone else (the channel closing, its own deadline)
        with pytest.raises(asyncio.CancelledError):
            await task
        assert inflight.cut == 0

    asyncio.run(scenario())
