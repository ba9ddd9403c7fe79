"""Liveness and readiness: HTTP /livez, /health and /ready (the same answer), and the gRPC
health statuses, before a decode worker is routable, once one registers, after it goes, and
while draining; a cluster run with prefill workers is not ready until one of them is."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tandem.common.security.grpc_auth import ROUTER_AUDIENCE, aio_interceptors
from tandem.placement.worker_view import Role
from tandem.protos.v1 import tandem_pb2, worker_pb2, worker_pb2_grpc
from tandem.router.readiness import LIVENESS_SERVICE
from tandem.router.tokenizer import RouterTokenizer
from tests.unit.router.fakes import CREDENTIAL, FakeDecode, FakePrefill, serve
from tests.unit.router.harness import Cluster, cluster

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
TANDEM, REGISTRY = "tandem.v1.Tandem", "tandem.v1.Registry"


async def register(c: Cluster, endpoint: str, worker_id: str = "d1",
                   role: int = worker_pb2.ROLE_DECODE) -> None:
    """Join ``endpoint`` as a worker of ``role`` through the Registry RPC, as a worker does."""
    address = f"127.0.0.1:{c.router.port}"
    async with grpc.aio.insecure_channel(address, interceptors=aio_interceptors(CREDENTIAL, ROUTER_AUDIENCE)) as ch:
        await worker_pb2_grpc.RegistryStub(ch).Register(worker_pb2.RegisterRequest(
            role=role, worker_id=worker_id, endpoint=endpoint))


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
    """/health's answer, checked to be /ready's too (one handler under two names)."""
    answers = []
    for path in ("/health", "/ready"):
        async with http.get(f"http://127.0.0.1:{c.router.http_port}{path}") as r:
            answers.append((r.status, await r.json()))
    assert answers[0] == answers[1], answers
    return answers[0]


async def _live(http: aiohttp.ClientSession, c: Cluster) -> int:
    async with http.get(f"http://127.0.0.1:{c.router.http_port}/livez") as r:
        assert await r.json() == {"status": "alive"}
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
                assert status == 200 and body == {"status": "ok"}
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
            assert await _live(http, c) == 200  # draining, not dead: no restart
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


def test_a_cluster_with_prefill_workers_is_ready_once_one_is_routable(
        tokenizer: RouterTokenizer) -> None:
    """``--expect-prefill`` (what ``tandem up`` passes when it starts prefill workers): a
    decode worker alone is not enough while the cluster starts; once a prefill worker has
    been routable, a decode worker alone keeps the router ready (it prefills itself)."""
    async def scenario() -> None:
        async with cluster(tokenizer, n_prefill=0, n_decode=0, http_port=0,
                           expect_prefill=True) as c, aiohttp.ClientSession() as http:
            decode = FakeDecode("kv-r", {})
            d_server, d_endpoint = await serve(
                decode, worker_pb2_grpc.add_DecodeServiceServicer_to_server)
            prefill = FakePrefill({})
            p_server, p_endpoint = await serve(
                prefill, worker_pb2_grpc.add_PrefillServiceServicer_to_server)
            try:
                await register(c, d_endpoint)
                status, body = await _ready(http, c)
                assert status == 503 and body["reason"].startswith("waiting for a prefill")
                assert "(0 known)" in body["reason"]
                assert (await _statuses(c))[""] == NOT_SERVING
                await register(c, p_endpoint, "p1", worker_pb2.ROLE_PREFILL)
                assert await _ready(http, c) == (200, {"status": "ok"})
                await _until_overall(c, SERVING)
                await p_server.stop(0)
                await c.router.monitor.probe_all()  # the prefill worker went away
                assert c.router.registry.routable(Role.PREFILL) == []
                assert (await _ready(http, c))[0] == 200  # served: on the decode worker
            finally:
                await d_server.stop(0)
                await p_server.stop(0)

    asyncio.run(scenario())


def test_static_prefill_endpoints_count_as_expected(tokenizer: RouterTokenizer) -> None:
    """``--prefill`` named on the command line implies ``--expect-prefill``; a cluster
    without (colocated) is ready on a decode worker alone."""
    from tandem.router.config import RouterConfig

    base = {"tokenizer_dir": "unused", "model_name": "m", "max_model_len": 16}
    assert RouterConfig(**base, prefill_endpoints=("127.0.0.1:1",)).expects_prefill
    assert RouterConfig(**base, expect_prefill=True).expects_prefill
    assert not RouterConfig(**base).expects_prefill
