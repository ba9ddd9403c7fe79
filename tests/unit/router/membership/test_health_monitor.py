"""The health monitor of a real router probing fake workers: grpc.health.v1, then Stats."""

from __future__ import annotations

import asyncio

import grpc

from protos.tandem.v1 import tandem_pb2, worker_pb2_grpc
from router.membership.worker_view import Role
from router.tokenizer import RouterTokenizer
from tests.unit.router.fakes import FakeDecode, serve
from tests.unit.router.harness import cluster
from tests.unit.router.test_readiness import register


class StallingDecode(FakeDecode):
    """A decode fake whose Stats, once ``stall`` is set, waits for ``release`` and then fails
    UNAVAILABLE: a probe of a worker still loading its model (or already gone)."""

    def __init__(self) -> None:
        super().__init__("kv-s", {})
        self.stall = False
        self.in_stats = asyncio.Event()
        self.release = asyncio.Event()

    async def Stats(self, request, context):  # noqa: N802
        if not self.stall:
            return await super().Stats(request, context)
        self.in_stats.set()
        await self.release.wait()
        await context.abort(grpc.StatusCode.UNAVAILABLE, "model still loading")


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



def test_registering_makes_a_worker_routable_whatever_an_older_probe_says(
    tokenizer: RouterTokenizer,
) -> None:
    """A worker registers while a probe that began before is still out: the probe's failure
    is stale and must not take the registered worker out of the pool."""

    async def scenario() -> None:
        async with cluster(tokenizer, n_prefill=0, n_decode=0) as c:
            fake = StallingDecode()
            server, endpoint = await serve(fake, worker_pb2_grpc.add_DecodeServiceServicer_to_server)
            registry, monitor = c.router.registry, c.router.monitor
            try:
                await register(c, endpoint)
                registry.set_healthy(endpoint, False)  # a stale mark: a call failed earlier
                await register(c, endpoint)  # registering again clears it
                assert [w.endpoint for w in registry.routable(Role.DECODE)] == [endpoint]
                fake.stall = True
                probe = asyncio.ensure_future(monitor.probe(endpoint))
                await asyncio.wait_for(fake.in_stats.wait(), 10)  # the probe is out ...
                await register(c, endpoint)  # ... the worker (re)registers ...
                fake.release.set()
                assert not await probe  # ... the probe fails, after the registration
                assert [w.endpoint for w in registry.routable(Role.DECODE)] == [endpoint]
                out = await c.generate(tandem_pb2.GenerateRequest(text="hi"))
                assert out[-1].finished  # served at once, no "no healthy decode worker"
                assert not await monitor.probe(endpoint)  # a probe begun since still counts
                assert registry.routable(Role.DECODE) == []
            finally:
                await server.stop(0)

    asyncio.run(scenario())

