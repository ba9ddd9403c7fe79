"""A router on 127.0.0.1:0 in front of fake workers, plus a client stub (one event loop)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc

from tandem.common.security.grpc_auth import ROUTER_AUDIENCE, aio_interceptors
from tandem.placement.policy import rank_decode, rank_prefill
from tandem.placement.worker_view import Role
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc, worker_pb2_grpc
from tandem.router.config import RouterConfig
from tandem.router.server import RouterServer
from tandem.router.tokenizer import RouterTokenizer
from tests.unit.router.fakes import CREDENTIAL, SECRET_FILE, FakeDecode, FakePrefill, serve

MODEL = "smollm2"


@dataclass(slots=True)
class Cluster:
    router: RouterServer
    stub: tandem_pb2_grpc.TandemStub
    channel: grpc.aio.Channel
    prefill: list[FakePrefill] = field(default_factory=list)
    decode: list[FakeDecode] = field(default_factory=list)
    prefill_endpoints: list[str] = field(default_factory=list)
    decode_endpoints: list[str] = field(default_factory=list)
    prefill_servers: list[grpc.aio.Server] = field(default_factory=list)

    @property
    def counters(self) -> Any:
        return self.router.servicer.counters

    async def generate(self, request: tandem_pb2.GenerateRequest, **kw: Any) -> list[Any]:
        return [r async for r in self.stub.Generate(request, **kw)]

    def first_decode(self, request_tokens: int) -> int:
        """Index in ``decode`` of the worker the decode policy ranks first for a request of
        ``request_tokens`` (prompt + max_tokens), asked of the pool as the router sees it."""
        pool = self.router.registry.routable(Role.DECODE)
        ranked = rank_decode(pool, request_tokens, self.router.config.block_size)
        return self.decode_endpoints.index(ranked[0].endpoint)

    def first_prefill(self) -> int:
        """Index in ``prefill`` of the worker the prefill policy ranks first for a prompt
        no worker has served yet (no prefix affinity)."""
        pool = self.router.registry.routable(Role.PREFILL)
        ranked = rank_prefill(pool, [], self.router.config.affinity_max_queue)
        return self.prefill_endpoints.index(ranked[0].endpoint)


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait until ``check()`` holds: for state the router changes after the client is done
    (an outcome counted, a slot given back once a cancelled handler unwinds)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.01)


@asynccontextmanager
async def cluster(
    tokenizer: RouterTokenizer, n_prefill: int = 1, n_decode: int = 1, **overrides: Any
) -> AsyncIterator[Cluster]:
    """Start fakes and a router wired to them; tear everything down afterwards."""
    decoders: dict[str, FakeDecode] = {}
    servers: list[grpc.aio.Server] = []
    prefill, decode, p_eps, d_eps, p_servers = [], [], [], [], []
    for i in range(n_decode):
        fake = FakeDecode(f"kv-{i}", decoders)
        server, endpoint = await serve(fake, worker_pb2_grpc.add_DecodeServiceServicer_to_server)
        servers.append(server)
        decode.append(fake)
        d_eps.append(endpoint)
    for _ in range(n_prefill):
        fake = FakePrefill(decoders)
        server, endpoint = await serve(fake, worker_pb2_grpc.add_PrefillServiceServicer_to_server)
        servers.append(server)
        p_servers.append(server)
        prefill.append(fake)
        p_eps.append(endpoint)
    options: dict[str, Any] = {
        "tokenizer_dir": "unused",
        "model_name": MODEL,
        "max_model_len": 2048,
        "port": 0,
        "prefill_endpoints": tuple(p_eps),
        "decode_endpoints": tuple(d_eps),
        "health_interval_s": 3600.0,  # one probe round at start (awaited), then explicit ones
        "health_timeout_s": 10.0,  # that round's Stats must not time out on a loaded machine
        "drain_timeout_s": 5.0,
        "cluster_secret_file": str(SECRET_FILE),
    }
    options.update(overrides)
    router = RouterServer(RouterConfig(**options), tokenizer)
    port = await _start(router)
    # Calls as a cluster member (the Registry needs it; the public service ignores it).
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}",
                                        interceptors=aio_interceptors(CREDENTIAL, ROUTER_AUDIENCE))
    try:
        yield Cluster(
            router,
            tandem_pb2_grpc.TandemStub(channel),
            channel,
            prefill,
            decode,
            p_eps,
            d_eps,
            p_servers,
        )
    finally:
        await channel.close()
        await router.stop(grace_s=0)
        for server in servers:
            await server.stop(0)


async def _start(router: RouterServer) -> int:
    """Start ``router``; return its port. Its start awaits the health monitor's first round
    (tandem/router/server.py), so every static worker's load is known and the monitor is quiet (its
    interval is an hour) before a test's first step: among equally idle workers the policy's
    choice is forced, the lowest endpoint. The assertion below keeps that promise tested.
    """
    port = await router.start()
    for endpoint in router.config.decode_endpoints:
        view = router.registry.view(endpoint)
        assert view is not None and view.num_blocks > 0, f"no Stats from {endpoint} yet"
    return port
