"""tandem/loadgen/load.py's pacing: open loop by arrival time, and with ``max_concurrency`` a
closed loop of that many users (a request is sent only when one of theirs has finished)."""

from __future__ import annotations

import asyncio

import pytest

from tandem.loadgen.load import _paced
from tandem.loadgen.stats import RequestResult
from tandem.loadgen.workload import RequestSpec


def _specs(n: int) -> list[RequestSpec]:
    return [RequestSpec(i, 0.0, "chat", (1, 2, 3), 4) for i in range(n)]


def test_max_concurrency_keeps_that_many_in_flight_and_sends_the_next_as_one_ends() -> None:
    async def main() -> tuple[list[int], list[RequestResult]]:
        in_flight: list[int] = []
        running: set[int] = set()
        done = {i: asyncio.Event() for i in range(7)}

        async def run_one(spec: RequestSpec, t0: float) -> RequestResult:
            running.add(spec.index)
            in_flight.append(len(running))
            await done[spec.index].wait()
            running.discard(spec.index)
            return RequestResult(spec.index, spec.kind, ok=True)

        task = asyncio.create_task(_paced(_specs(7), run_one, None, max_concurrency=3))
        for i in range(7):  # finish them one at a time, once each is running
            while i not in running:
                await asyncio.sleep(0)
            done[i].set()
        results, _ = await task
        return in_flight, results

    in_flight, results = asyncio.run(main())
    assert max(in_flight) == 3 and len(in_flight) == 7
    assert [r.index for r in results] == list(range(7))


def test_without_a_limit_every_request_goes_at_its_arrival() -> None:
    async def main() -> int:
        started: list[int] = []
        gate = asyncio.Event()

        async def run_one(spec: RequestSpec, t0: float) -> RequestResult:
            started.append(spec.index)
            if len(started) == 5:
                gate.set()
            await gate.wait()
            return RequestResult(spec.index, spec.kind, ok=True)

        await _paced(_specs(5), run_one, None)
        return len(started)

    assert asyncio.run(main()) == 5


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_concurrency"):
        asyncio.run(_paced(_specs(1), lambda s, t: None, None, max_concurrency=0))
