"""Liveness and readiness: HTTP /health and /ready, and the gRPC health statuses, before a
decode worker is routable, once one registers, after it goes, and while draining."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tandem.common.security.grpc_auth import ROUTER_AUDIENCE, aio_interceptors
from tandem.protos.v1 import tandem_pb2, worker_pb2, worker_pb2_grpc
from tandem.router.readiness import LIVENESS_SERVICE
from tandem.router.tokenizer import RouterTokenizer
from tests.unit.router.fakes import CREDENTIAL, FakeDecode, serve
from tests.unit.router.harness import Cluster, cluster

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
TANDEM, REGISTRY = "tandem.v1.Tandem", "tandem.v1.Registry"


async def register(c: Cluster, endpoint: str, worker_id: str = "d1") -> None:
    """Join ``endpoint`` as a decode worker through the Registry RPC, as a worker does."""
    address = f"127.0.0.1:{c.router.port}"
    async with grpc.aio.insecure_channel(address, interceptors=aio_interceptors(CREDENTIAL, ROUTER_AUDIENCE)) as ch:
        await worker_pb2_grpc.RegistryStub(ch).Register(worker_pb2.RegisterRequest(
            role=worker_pb2.ROLE_DECODE, worker_id=worker_id, endpoint=endpoint))


async def _statuses(c: Cluster) -> dict[str, int]:
    health = health_pb2_grpc.HealthStub(c.channel)
    out = {}
    for service in ("", TANDEM, REGISTRY, LIVENESS_SERVICE):
        reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
        out[service] = reply.status
    return out


async def _until_overall(c: Cluster, want: int) -> None:
    """Wait (on the Watch stream) until the overall gRPC status is ``want``."""
    health = health_pb2_grpc.HealthStub(c.channel)
    watch = health.Watch(health_pb2.HealthCheckRequest(service=""))

    async def seen() -> None:
        async for reply in watch:
            if reply.status == want:
                return

    try:
        await asyncio.wait_for(seen(), 10)
    finally:
        watch.cancel()


async def _ready(http: aiohttp.ClientSession, c: Cluster) -> tuple[int, Any]:
    async with http.get(f"http://127.0.0.1:{c.router.http_port}/ready") as r:
        return r.status, await r.json()


async def _live(http: aiohttp.ClientSession, c: Cluster) -> int:
    async with http.get(f"http://127.0.0.1:{c.router.http_port}/health") as r:
        return r.status


def test_ready_follows_routable_decode_workers(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, n_prefill=0, n_decode=0, http_port=0) as c, \
                aiohttp.ClientSession() as http:
            # Up, but nothing to serve with: live, not ready; workers may still join.
            assert await _live(http, c) == 200
            status, body = await _ready(http, c)
            assert status == 503 and body["reason"] == "no decode worker registered"
            assert await _statuses(c) == {"": NOT_SERVING, TANDEM: NOT_SERVING,
                                          REGISTRY: SERVING, LIVENESS_SERVICE: SERVING}
            fake = FakeDecode("kv-r", {})
            server, endpoint = await serve(fake, worker_pb2_grpc.add_DecodeServiceServicer_to_server)
            try:
                await register(c, endpoint)
                status, body = await _ready(http, c)  # routable at once
                assert status == 200 and body == {"status": "ready"}
                await _until_overall(c, SERVING)
                assert (await _statuses(c))[TANDEM] == SERVING
                out = await c.generate(tandem_pb2.GenerateRequest(text="hi"))
                assert out[-1].finished
            finally:
                await server.stop(0)
            await c.router.monitor.probe_all()  # it went away
            status, body = await _ready(http, c)
            assert status == 503 and "no healthy decode worker (1 known" in body["reason"]
            await _until_overall(c, NOT_SERVING)
            assert (await _statuses(c))[TANDEM] == NOT_SERVING
            await c.router.stop_accepting()
            status, body = await _ready(http, c)
            assert status == 503 and body["reason"].startswith("draining")
            assert await _statuses(c) == {"": NOT_SERVING, TANDEM: NOT_SERVING,
                                          REGISTRY: NOT_SERVING, LIVENESS_SERVICE: SERVING}

    asyncio.run(scenario())


def test_static_workers_are_ready_from_the_start(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, http_port=0) as c, aiohttp.ClientSession() as http:
            assert (await _ready(http, c))[0] == 200
            assert (await _statuses(c))[""] == SERVING
            c.router.registry.set_healthy(c.decode_endpoints[0], False)  # a failed call
            assert (await _ready(http, c))[0] == 503
            await _until_overall(c, NOT_SERVING)
            await c.router.monitor.probe_all()  # the next probe passes: back in the pool
            assert (await _ready(http, c))[0] == 200
            await _until_overall(c, SERVING)

    asyncio.run(scenario())
