"""RegistryClient against a fake router: register, heartbeat, re-register, survive outages.
The worker hands the client plain values (``Registration``, ``WorkerStatus``); the fake router
sees the protos the client makes of them."""

from __future__ import annotations

import asyncio
import socket

import grpc

from tandem.engine.outputs import EngineStats
from tandem.kv_transfer import KvLayout
from tandem.protos.v1 import worker_pb2, worker_pb2_grpc
from tandem.worker.registration import RegistrationConfig, RegistryClient
from tandem.worker.reports import Registration, WorkerStatus
from tests.unit.worker.harness import until

LAYOUT = KvLayout("m", "float32", "float32", 16, 2, 2, 16)


def registration() -> Registration:
    return Registration("decode", "w1", "127.0.0.1:1", LAYOUT, kv_endpoint="h|tcp=127.0.0.1:2")


def worker_status(free_blocks: int) -> WorkerStatus:
    engine = EngineStats(num_running=0, num_waiting=0, num_waiting_for_remote_kv=0, num_held=0,
                         num_blocks=8, num_free_blocks=free_blocks, kv_cache_usage=0.0,
                         prefix_cache_queries=0, prefix_cache_hits=0, num_preemptions=0,
                         num_steps=0, num_generated_tokens=0)
    return WorkerStatus("decode", "w1", engine)


class FakeRouter(worker_pb2_grpc.RegistryServicer):
    """Remembers registrations; forgets a worker once when told to."""

    def __init__(self, interval_s: float = 0.02) -> None:
        self.interval_s = interval_s
        self.registered: list[worker_pb2.RegisterRequest] = []
        self.beats: list[worker_pb2.HeartbeatRequest] = []
        self.forget_next = False

    async def Register(self, request, context):  # noqa: N802
        self.registered.append(request)
        return worker_pb2.RegisterResponse(heartbeat_interval_s=self.interval_s)

    async def Heartbeat(self, request, context):  # noqa: N802
        self.beats.append(request)
        known = not self.forget_next
        self.forget_next = False
        return worker_pb2.HeartbeatResponse(known=known)


async def _serve(router: FakeRouter, port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    worker_pb2_grpc.add_RegistryServicer_to_server(router, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, port


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _client(port: int) -> RegistryClient:
    async def stats() -> WorkerStatus:
        return worker_status(7)

    return RegistryClient(
        RegistrationConfig(f"127.0.0.1:{port}", min_backoff_s=0.01, max_backoff_s=0.05),
        registration,
        stats,
    )


def test_the_first_heartbeat_brings_the_stats_at_once() -> None:
    """The router learns a new worker's load and step costs right after it registers, not an
    interval later (placement has no signal until then)."""

    async def main() -> None:
        router = FakeRouter(interval_s=3600.0)
        server, port = await _serve(router)
        task = asyncio.create_task(_client(port).run())

        async def count() -> int:
            return len(router.beats)

        await until(count, lambda n: n == 1)
        assert router.beats[0].stats.num_free_blocks == 7
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop(None)

    asyncio.run(main())


def test_register_heartbeat_and_reregister() -> None:
    async def main() -> None:
        router = FakeRouter()
        server, port = await _serve(router)
        client = _client(port)
        task = asyncio.create_task(client.run())

        async def count() -> tuple[int, int]:
            return len(router.registered), len(router.beats)

        await until(count, lambda n: n[0] == 1 and n[1] >= 2)
        reg = router.registered[0]
        assert (reg.role, reg.worker_id, reg.endpoint, reg.kv_endpoint) == (
            worker_pb2.ROLE_DECODE, "w1", "127.0.0.1:1", "h|tcp=127.0.0.1:2")
        assert reg.layout.fingerprint == LAYOUT.fingerprint
        assert router.beats[0].stats.num_free_blocks == 7 and router.beats[0].worker_id == "w1"
        assert router.beats[0].stats.role == worker_pb2.ROLE_DECODE
        router.forget_next = True
        await until(count, lambda n: n[0] == 2)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop(None)

    asyncio.run(main())


def test_unreachable_router_is_retried_until_it_appears() -> None:
    async def main() -> None:
        port = _free_port()
        client = _client(port)
        task = asyncio.create_task(client.run())

        async def failures() -> int:
            return client.failures

        await until(failures, lambda n: n >= 2)
        assert not task.done()
        router = FakeRouter()
        server, _ = await _serve(router, port)

        async def registered() -> int:
            return client.registrations

        await until(registered, lambda n: n >= 1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop(None)

    asyncio.run(main())


def test_a_slow_stats_read_does_not_delay_the_heartbeat() -> None:
    """Stats come from the engine thread between steps; a long step (a 2,048-token prefill on
    two shared cores takes seconds) must not hold the beat back past the router's lease: the
    beat carries the last stats read, and the read in flight serves a later beat."""

    async def main() -> None:
        router = FakeRouter()
        server, port = await _serve(router)
        gate = asyncio.Event()
        reads = 0

        async def stats() -> WorkerStatus:
            nonlocal reads
            reads += 1
            if reads == 2:  # the second read waits for a step that does not end
                await gate.wait()
            return worker_status(reads)

        client = RegistryClient(RegistrationConfig(f"127.0.0.1:{port}"), registration, stats)
        task = asyncio.create_task(client.run())

        async def beats() -> int:
            return len(router.beats)

        await until(beats, lambda n: n >= 4)  # beats go on while read 2 hangs
        assert [b.stats.num_free_blocks for b in router.beats[:4]] == [1, 1, 1, 1]
        assert reads == 2 and client.stale_beats >= 3
        gate.set()  # the step ends: the read in flight lands in the next beat
        await until(beats, lambda n: n >= 6)
        assert router.beats[-1].stats.num_free_blocks >= 2
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop(None)

    asyncio.run(main())
