"""The Registry service a real router runs: a worker registers, heartbeats, and is served."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tandem.common.security.credential import ClusterCredential
from tandem.common.security.grpc_auth import ROUTER_AUDIENCE, aio_interceptors
from tandem.protos.v1 import tandem_pb2, worker_pb2, worker_pb2_grpc
from tandem.router.tokenizer import RouterTokenizer
from tests.unit.router.fakes import FakeDecode, serve
from tests.unit.router.harness import cluster


def test_registered_worker_serves_and_heartbeats(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, n_prefill=0, n_decode=0) as c:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.generate(tandem_pb2.GenerateRequest(text="hi"))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            fake = FakeDecode("kv-x", {})
            server, endpoint = await serve(
                fake, worker_pb2_grpc.add_DecodeServiceServicer_to_server
            )
            registry = worker_pb2_grpc.RegistryStub(c.channel)
            reply = await registry.Register(
                worker_pb2.RegisterRequest(
                    role=worker_pb2.ROLE_DECODE, worker_id="d1", endpoint=endpoint
                )
            )
            assert reply.heartbeat_interval_s > 0
            beat = await registry.Heartbeat(
                worker_pb2.HeartbeatRequest(
                    worker_id="d1", stats=worker_pb2.WorkerStats(num_free_blocks=7, num_blocks=9)
                )
            )
            assert beat.known
            assert c.router.registry.view(endpoint).num_free_blocks == 7  # type: ignore[union-attr]
            unknown = await registry.Heartbeat(worker_pb2.HeartbeatRequest(worker_id="zz"))
            assert not unknown.known
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await registry.Register(worker_pb2.RegisterRequest(endpoint=endpoint))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            out = await c.generate(tandem_pb2.GenerateRequest(text="hi"))
            assert out[-1].finished and fake.local_prefills
            await server.stop(0)

    asyncio.run(scenario())


def test_membership_is_proven_never_claimed(tokenizer: RouterTokenizer) -> None:
    """Without the cluster credential, Register and Heartbeat are refused and change nothing:
    no fake worker joins the pool, no heartbeat marks a real one draining."""

    async def scenario() -> None:
        async with cluster(tokenizer, n_prefill=0, n_decode=1) as c:
            victim = c.decode_endpoints[0]
            before = c.router.registry.view(victim)
            other = ClusterCredential(b"another cluster's secret........")
            for interceptors in ([], aio_interceptors(other, ROUTER_AUDIENCE)):
                target = f"127.0.0.1:{c.router.port}"
                async with grpc.aio.insecure_channel(target, interceptors=interceptors) as ch:
                    registry = worker_pb2_grpc.RegistryStub(ch)
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await registry.Register(worker_pb2.RegisterRequest(
                            role=worker_pb2.ROLE_DECODE, worker_id="spoof",
                            endpoint="127.0.0.1:9"))
                    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await registry.Heartbeat(worker_pb2.HeartbeatRequest(
                            worker_id="spoof", stats=worker_pb2.WorkerStats(draining=True)))
                    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert c.router.registry.view("127.0.0.1:9") is None
            assert c.router.registry.view(victim) == before

    asyncio.run(scenario())
