"""A router on 127.0.0.1:0 in front of fake workers, plus a client stub (one event loop)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc

from protos.tandem.v1 import tandem_pb2, tandem_pb2_grpc, worker_pb2_grpc
from router.config import RouterConfig
from router.server import RouterServer
from router.tokenizer import RouterTokenizer
from tests.unit.router.fakes import FakeDecode, FakePrefill, serve

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
        "health_interval_s": 3600.0,
        "drain_timeout_s": 5.0,
    }
    options.update(overrides)
    router = RouterServer(RouterConfig(**options), tokenizer)
    port = await router.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
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
