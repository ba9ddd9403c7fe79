"""The health monitor of a real router probing fake workers: grpc.health.v1, then Stats;
and the calls it cuts when a worker cannot be reached."""

from __future__ import annotations

import asyncio
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tandem.common.security.grpc_auth import ClusterAuthInterceptor, aio_interceptors
from tandem.placement.worker_view import Role
from tandem.protos.v1 import tandem_pb2, worker_pb2_grpc
from tandem.router.membership.health_monitor import HealthMonitor
from tandem.router.membership.registry import Registry
from tandem.router.membership.worker_clients import WorkerClients
from tandem.router.tokenizer import RouterTokenizer
from tests.unit.router.fakes import CREDENTIAL, FakeDecode, serve
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
    """A slow Stats answer (a loaded host) is not a dead worker."""

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



class HealthDouble(health_pb2_grpc.HealthServicer):
    """grpc.health.v1 that answers ``status``, or (``hang``) nothing at all: a worker behind
    a partition, whose connection stays open while no byte comes back."""

    def __init__(self) -> None:
        self.status = health_pb2.HealthCheckResponse.SERVING
        self.hang = False

    async def Check(self, request, context):  # noqa: N802
        if self.hang:
            await asyncio.Event().wait()  # until the probe's deadline cancels it
        return health_pb2.HealthCheckResponse(status=self.status)


class CutRecorder:
    """A CutsCalls that records what it was told to cut."""

    def __init__(self) -> None:
        self.cuts: list[tuple[str, str]] = []
        self.inflight: dict[str, int] = {}  # endpoint -> calls the test says are in flight

    def cancel(self, endpoint: str, reason: str) -> int:
        self.cuts.append((endpoint, reason))
        return 1

    def count(self, endpoint: str) -> int:
        return self.inflight.get(endpoint, 0)


class NoAffinity:
    def forget(self, endpoint: str) -> None:
        pass


def test_calls_to_an_unreachable_worker_are_cut_but_a_draining_ones_are_not() -> None:
    """Two probes in a row that cannot reach a worker cut its calls; one slow probe only
    takes it out of routing; a worker that answers NOT_SERVING (draining) keeps its calls."""

    async def scenario() -> None:
        health = HealthDouble()
        auth = ClusterAuthInterceptor(CREDENTIAL)
        server = grpc.aio.server(interceptors=[auth])
        worker_pb2_grpc.add_DecodeServiceServicer_to_server(FakeDecode("kv-h", {}), server)
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        endpoint = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        auth.answer_to([endpoint])
        await server.start()
        clients = WorkerClients(interceptors=lambda e: aio_interceptors(CREDENTIAL, e))
        registry = Registry(time.monotonic, 1.0)
        registry.add_static(Role.DECODE, endpoint)
        recorder = CutRecorder()
        monitor = HealthMonitor(registry, clients, NoAffinity(), 3600.0, 0.3, recorder)
        try:
            assert await monitor.probe(endpoint)
            health.hang = True
            assert not await monitor.probe(endpoint)  # out of routing, calls untouched
            assert registry.routable(Role.DECODE) == [] and recorder.cuts == []
            assert not await monitor.probe(endpoint)  # unreachable twice in a row: cut
            assert [e for e, _ in recorder.cuts] == [endpoint]
            assert "DEADLINE_EXCEEDED" in recorder.cuts[0][1]
            health.hang = False
            health.status = health_pb2.HealthCheckResponse.NOT_SERVING  # draining
            for _ in range(3):
                assert not await monitor.probe(endpoint)
            assert len(recorder.cuts) == 1  # a drain finishes what it has
            health.status = health_pb2.HealthCheckResponse.SERVING
            assert await monitor.probe(endpoint)
            assert len(registry.routable(Role.DECODE)) == 1
        finally:
            await clients.close()
            await server.stop(0)

    asyncio.run(scenario())


def test_a_late_heartbeat_forgets_the_worker_but_not_its_streams(
    tokenizer: RouterTokenizer,
) -> None:
    """A worker whose lease expired while its health check still answers (its heartbeats
    were late: a long engine step on a loaded host) leaves the pool, but the stream it is
    serving goes on to its end; its channel closes after, and a fresh registration routes
    to it again."""

    async def scenario() -> None:
        async with cluster(tokenizer, n_prefill=0, n_decode=0) as c:
            fake = FakeDecode("kv-late", {})
            server, endpoint = await serve(fake, worker_pb2_grpc.add_DecodeServiceServicer_to_server)
            registry, monitor = c.router.registry, c.router.monitor
            now = [time.monotonic()]
            registry._clock = lambda: now[0]  # the lease runs out when the test says
            try:
                await register(c, endpoint)
                fake.hang_after = 1
                stream = asyncio.ensure_future(c.generate(tandem_pb2.GenerateRequest(text="hi")))
                await asyncio.wait_for(fake.hanging.wait(), 10)
                now[0] += 3600.0
                await monitor.probe_all()
                assert registry.role_of(endpoint) is None  # forgotten: no new requests
                assert c.router.inflight.count(endpoint) == 1 and c.router.inflight.cut == 0
                assert endpoint in c.router.clients.endpoints()
                fake.resume.set()
                out = await asyncio.wait_for(stream, 10)
                assert out[-1].finished and out[-1].finish_reason
                await monitor.probe_all()  # its calls have ended: the channel goes
                assert endpoint not in c.router.clients.endpoints()
                await register(c, endpoint)
                again = await c.generate(tandem_pb2.GenerateRequest(text="hi"))
                assert again[-1].finished
                assert registry.view(endpoint).active == 0  # type: ignore[union-attr]
            finally:
                await server.stop(0)

    asyncio.run(scenario())


def test_an_expired_lease_keeps_the_channel_of_a_worker_that_registers_again() -> None:
    """Forgotten with a call in flight, then registered again before that call ends: the
    channel is the registered worker's again and stays open; the router's count of its
    requests carries over, so the call's end balances it."""

    async def scenario() -> None:
        health = HealthDouble()
        auth = ClusterAuthInterceptor(CREDENTIAL)
        server = grpc.aio.server(interceptors=[auth])
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        endpoint = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        auth.answer_to([endpoint])
        await server.start()
        clients = WorkerClients(interceptors=lambda e: aio_interceptors(CREDENTIAL, e))
        now = [0.0]
        registry = Registry(lambda: now[0], 1.0)
        recorder = CutRecorder()
        monitor = HealthMonitor(registry, clients, NoAffinity(), 3600.0, 1.0, recorder)
        try:
            registry.register(Role.DECODE, endpoint, "d1")
            registry.acquire(endpoint)
            recorder.inflight[endpoint] = 1
            now[0] = 10.0
            await monitor.probe_all()
            assert registry.role_of(endpoint) is None and recorder.cuts == []
            registry.register(Role.DECODE, endpoint, "d1")  # its next heartbeat
            assert registry.view(endpoint).active == 1  # type: ignore[union-attr]
            recorder.inflight[endpoint] = 0
            registry.release(endpoint)
            await monitor.probe_all()
            assert endpoint in clients.endpoints()  # registered: its channel is in use
            assert registry.view(endpoint).active == 0  # type: ignore[union-attr]
            now[0] = 20.0
            health.hang = True  # expired again, and this time it cannot be reached
            recorder.inflight[endpoint] = 1
            await monitor.probe_all()
            assert [e for e, _ in recorder.cuts] == [endpoint]
            assert "cannot be reached" in recorder.cuts[0][1]
            assert endpoint not in clients.endpoints()
        finally:
            await clients.close()
            await server.stop(0)

    asyncio.run(scenario())
