"""The cluster credential on gRPC: refused without it, accepted with it, for unary and
streaming calls, aio and sync clients; health stays open."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from tandem.common.security.credential import ClusterCredential
from tandem.common.security.grpc_auth import ClusterAuthInterceptor, aio_interceptors, sync_channel
from tandem.protos.v1 import tandem_pb2, worker_pb2, worker_pb2_grpc

CRED = ClusterCredential(b"k" * 32)


class _Decode(worker_pb2_grpc.DecodeServiceServicer):
    async def Stats(self, request, context):  # noqa: N802
        return worker_pb2.WorkerStats(num_blocks=3)

    async def Decode(self, request, context) -> AsyncIterator[tandem_pb2.GenerateResponse]:  # noqa: N802
        for i in range(3):
            yield tandem_pb2.GenerateResponse(token_ids=[i])


async def _server(credential: ClusterCredential) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server(interceptors=[ClusterAuthInterceptor(credential)])
    worker_pb2_grpc.add_DecodeServiceServicer_to_server(_Decode(), server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    return server, f"127.0.0.1:{port}"


def test_aio_members_pass_strangers_are_refused() -> None:
    async def scenario() -> None:
        server, target = await _server(CRED)
        try:
            async with grpc.aio.insecure_channel(target,
                                                 interceptors=aio_interceptors(CRED)) as ch:
                stub = worker_pb2_grpc.DecodeServiceStub(ch)
                assert (await stub.Stats(worker_pb2.StatsRequest())).num_blocks == 3
                tokens = [m.token_ids[0] async for m in stub.Decode(worker_pb2.DecodeRequest())]
                assert tokens == [0, 1, 2]
            stranger = ClusterCredential(b"z" * 32)
            for interceptors in ([], aio_interceptors(stranger)):
                async with grpc.aio.insecure_channel(target, interceptors=interceptors) as ch:
                    stub = worker_pb2_grpc.DecodeServiceStub(ch)
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await stub.Stats(worker_pb2.StatsRequest())
                    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
                    assert "cluster credential" in (err.value.details() or "")
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        async for _ in stub.Decode(worker_pb2.DecodeRequest()):
                            pass
                    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
                    health = health_pb2_grpc.HealthStub(ch)  # probes carry no secret
                    reply = await health.Check(health_pb2.HealthCheckRequest())
                    assert reply.status == health_pb2.HealthCheckResponse.SERVING
        finally:
            await server.stop(0)

    asyncio.run(scenario())


def test_sync_client_and_insecure_server() -> None:
    async def scenario() -> None:
        server, target = await _server(CRED)
        open_server, open_target = await _server(ClusterCredential.insecure_default())
        try:
            def calls() -> None:
                with sync_channel(grpc.insecure_channel(target), CRED) as ch:
                    stub = worker_pb2_grpc.DecodeServiceStub(ch)
                    assert stub.Stats(worker_pb2.StatsRequest(), timeout=10).num_blocks == 3
                    assert len(list(stub.Decode(worker_pb2.DecodeRequest(), timeout=10))) == 3
                with grpc.insecure_channel(open_target) as ch:  # --insecure: anyone
                    stub = worker_pb2_grpc.DecodeServiceStub(ch)
                    assert stub.Stats(worker_pb2.StatsRequest(), timeout=10).num_blocks == 3

            await asyncio.to_thread(calls)
        finally:
            await server.stop(0)
            await open_server.stop(0)

    asyncio.run(scenario())
