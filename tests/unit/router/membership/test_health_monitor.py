"""The health monitor of a real router probing fake workers: grpc.health.v1, then Stats."""

from __future__ import annotations

import asyncio

from protos.tandem.v1 import tandem_pb2
from router.membership.worker_view import Role
from router.tokenizer import RouterTokenizer
from tests.unit.router.harness import cluster


def test_health_probe_removes_a_dead_prefill_worker(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, n_prefill=1) as c:
            registry = c.router.registry
            await c.router.monitor.probe_all()
            assert len(registry.routable(Role.PREFILL)) == 1
            assert registry.view(c.decode_endpoints[0]).num_blocks == 100  # type: ignore[union-attr]
            await c.prefill_servers[0].stop(0)
            await c.router.monitor.probe_all()
            assert registry.routable(Role.PREFILL) == []
            out = await c.generate(tandem_pb2.GenerateRequest(text="hi"))
            assert out[-1].finished and c.counters.local_prefill_colocated == 1

    asyncio.run(scenario())


def test_a_worker_busy_in_a_long_step_stays_in_the_pool(tokenizer: RouterTokenizer) -> None:
    """Stats waits for the worker's engine step; a slow answer is not a dead worker."""

    async def scenario() -> None:
        # The stuck Stats always runs out this timeout; the health check before it must
        # answer within it, on a loaded machine too (0.2 s was tight for that).
        async with cluster(tokenizer, health_timeout_s=1.0) as c:
            registry = c.router.registry
            await c.router.monitor.probe_all()
            c.decode[0].stats_stuck = True
            await c.router.monitor.probe_all()  # health passes, Stats times out
            assert len(registry.routable(Role.DECODE)) == 1
            out = await c.generate(tandem_pb2.GenerateRequest(text="hi"))
            assert out[-1].finished

    asyncio.run(scenario())
