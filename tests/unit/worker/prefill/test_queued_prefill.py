"""A prefill that waits in the prefill engine's queue longer than its reservation's lease still
completes: the prefill worker opens the transfer (BEGIN) when it accepts the Prefill, and the
connection's keepalives renew the lease until the KV is pushed; the sender's own deadline (the
Prefill's transfer timeout) is what bounds the wait.

The queueing is forced: the prefill engine's step is gated (it takes no step until the test
opens the gate, while calls such as Stats still run). Every wait is on a condition.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from tests.unit.worker.harness import Cluster, cluster, greedy, reference, until

PROMPT = [7 + (i * 29) % 230 for i in range(37)]  # three blocks of 16
# The Reserve's lease: shorter than the time the prefill is kept queued (KEEPALIVES_PAST
# keepalives), long enough that the push's BEGIN, which starts the renewals, reaches the
# decode worker within it on a loaded machine (at 0.3 s a fresh-clone run under load let it
# lapse before the transfer was bound).
LEASE_S = 1.0
PROGRESS_S = 0.4  # the receiver's progress timeout: a KEEPALIVE every 0.1 s
KEEPALIVES_PAST = 15  # at least 1.5 s queued: past the lease, and past three progress timeouts


class StepGate:
    """Holds an engine's steps (not its calls) until ``open``: requests wait in its queue."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._step = engine.step
        self._open = threading.Event()
        engine.step = self._gated

    def _gated(self) -> Any:
        if not self._open.wait(0.01):  # the engine thread polls; calls run in between
            return []
        return self._step()

    def open(self) -> None:
        self._open.set()

    def remove(self) -> None:
        self._open.set()
        del self._engine.step


@pytest.fixture
def engines(tiny_dir, make_engine):
    path = str(tiny_dir("llama", 2))
    return (make_engine(model=path, num_blocks=32, block_size=16),
            make_engine(model=path, num_blocks=32, block_size=16),
            make_engine(model=path, num_blocks=32, block_size=16))


@pytest.fixture
def gate(engines) -> Iterator[StepGate]:
    g = StepGate(engines[1])
    yield g
    g.remove()


def _short_progress_timeout(c: Cluster) -> None:
    # The harness's receiver has the default progress timeout (10 s); a shorter one makes the
    # keepalives, and so the test, fast. It applies to connections made from now on.
    c.receiver.config = dataclasses.replace(c.receiver.config, progress_timeout_s=PROGRESS_S)


async def _queued(c: Cluster) -> None:
    """The Prefill was accepted, its transfer bound, and the request waits in the engine."""
    await until(c.prefill_stats, lambda s: s.num_waiting == 1)
    await until(c.decode_stats, lambda s: s.num_reserved == 1)
    assert c.receiver.stats().bound_transfers == 1


def test_prefill_queued_past_the_lease_completes(engines, gate: StepGate) -> None:
    decode_engine, prefill_engine, ref_engine = engines
    want = reference(ref_engine, PROMPT, 6)

    async def main() -> None:
        async with cluster(decode_engine, prefill_engine) as c:
            _short_progress_timeout(c)
            res = await c.reserve("q", PROMPT, greedy(6), lease_s=LEASE_S)
            call = asyncio.ensure_future(c.prefill_into("q", PROMPT, greedy(6), res))
            await _queued(c)
            # The request stays queued behind the gate meanwhile.
            stats = await c.receiver.wait_until(lambda s: s.keepalives >= KEEPALIVES_PAST)
            assert (stats.reservations, stats.expired, stats.aborted) == (1, 0, 0)
            assert (await c.prefill_stats()).num_waiting == 1
            gate.open()
            first = await call
            msgs = await c.decode_all("q")
            assert [first.first_token] + [t for m in msgs for t in m.token_ids] == want
            assert msgs[-1].finished and msgs[-1].finish_reason == "length"
            rx = c.receiver.stats()
            assert (rx.committed, rx.expired, rx.aborted) == (1, 0, 0)
        # the harness's exit checked both workers idle and every block free

    asyncio.run(main())


def test_the_senders_deadline_still_bounds_a_queued_prefill(engines, gate: StepGate) -> None:
    """Queued past the Prefill's transfer timeout: the decode worker's receiver ends the lease
    at that deadline (keepalives do not carry it further) and frees the blocks; the prefill
    fails RESOURCE_EXHAUSTED once it runs (busy, not gone: the router tries another worker
    instead of marking this one down), and nothing is left held on either side."""
    decode_engine, prefill_engine, _ = engines

    async def main() -> None:
        async with cluster(decode_engine, prefill_engine, transfer_timeout_s=1.0) as c:
            _short_progress_timeout(c)
            res = await c.reserve("late", PROMPT, greedy(4), lease_s=LEASE_S)
            call = asyncio.ensure_future(c.prefill_into("late", PROMPT, greedy(4), res))
            await _queued(c)
            stats = await c.receiver.wait_until(lambda s: s.expired == 1)
            assert stats.keepalives >= 1 and stats.reservations == 0
            await until(c.decode_stats, lambda s: s.num_reserved == 0)
            gate.open()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "KV push failed" in (err.value.details() or "")
            assert "this prefill worker is busy" in (err.value.details() or "")
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                await c.decode_all("late")
            assert ended.value.code() == grpc.StatusCode.ABORTED

    asyncio.run(main())
