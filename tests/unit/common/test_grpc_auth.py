"""The cluster credential on gRPC: refused without it, accepted with it, for unary and
streaming calls, aio and sync clients; health stays open. A token opens one call: to the
worker, the method and the request it was minted for; a malformed one is UNAUTHENTICATED."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from tandem.common.security.credential import ClusterCredential, request_digest
from tandem.common.security.grpc_auth import (
    METADATA_KEY,
    ClusterAuthInterceptor,
    aio_interceptors,
    sync_channel,
    worker_audience,
)
from tandem.protos.v1 import tandem_pb2, worker_pb2, worker_pb2_grpc

CRED = ClusterCredential(b"k" * 32)
STATS = "/tandem.v1.DecodeService/Stats"
ABORT = "/tandem.v1.DecodeService/Abort"


class _Decode(worker_pb2_grpc.DecodeServiceServicer):
    def __init__(self) -> None:
        self.calls: list[str] = []  # what reached the servicer

    async def Stats(self, request, context):  # noqa: N802
        self.calls.append("Stats")
        return worker_pb2.WorkerStats(num_blocks=3)

    async def Abort(self, request, context):  # noqa: N802
        self.calls.append(f"Abort {request.request_id}")
        return worker_pb2.AbortResponse()

    async def Decode(self, request, context) -> AsyncIterator[tandem_pb2.GenerateResponse]:  # noqa: N802
        self.calls.append("Decode")
        for i in range(3):
            yield tandem_pb2.GenerateResponse(token_ids=[i])

    async def PrefillLocal(self, request, context):  # noqa: N802
        # a unary call whose behaviour is a plain coroutine calling into the context
        self.calls.append("PrefillLocal")
        return worker_pb2.PrefillResponse(first_token=len(request.request_id))


async def _server(credential: ClusterCredential) -> tuple[grpc.aio.Server, str, _Decode]:
    auth = ClusterAuthInterceptor(credential)
    server = grpc.aio.server(interceptors=[auth])
    servicer = _Decode()
    worker_pb2_grpc.add_DecodeServiceServicer_to_server(servicer, server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = server.add_insecure_port("127.0.0.1:0")
    auth.answer_to(worker_audience("127.0.0.1", port))
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    return server, f"127.0.0.1:{port}", servicer


def _code(err: pytest.ExceptionInfo[grpc.aio.AioRpcError]) -> grpc.StatusCode:
    return err.value.code()


def test_aio_members_pass_strangers_are_refused() -> None:
    async def scenario() -> None:
        server, target, servicer = await _server(CRED)
        try:
            async with grpc.aio.insecure_channel(
                    target, interceptors=aio_interceptors(CRED, target)) as ch:
                stub = worker_pb2_grpc.DecodeServiceStub(ch)
                assert (await stub.Stats(worker_pb2.StatsRequest())).num_blocks == 3
                tokens = [m.token_ids[0] async for m in stub.Decode(worker_pb2.DecodeRequest())]
                assert tokens == [0, 1, 2]
                reply = await stub.PrefillLocal(worker_pb2.PrefillLocalRequest(request_id="abc"))
                assert reply.first_token == 3
            stranger = ClusterCredential(b"z" * 32)
            before = list(servicer.calls)
            for interceptors in ([], aio_interceptors(stranger, target)):
                async with grpc.aio.insecure_channel(target, interceptors=interceptors) as ch:
                    stub = worker_pb2_grpc.DecodeServiceStub(ch)
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await stub.Stats(worker_pb2.StatsRequest())
                    assert _code(err) == grpc.StatusCode.UNAUTHENTICATED
                    assert "cluster credential" in (err.value.details() or "")
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        async for _ in stub.Decode(worker_pb2.DecodeRequest()):
                            pass
                    assert _code(err) == grpc.StatusCode.UNAUTHENTICATED
                    health = health_pb2_grpc.HealthStub(ch)  # probes carry no secret
                    reply = await health.Check(health_pb2.HealthCheckRequest())
                    assert reply.status == health_pb2.HealthCheckResponse.SERVING
            assert servicer.calls == before  # nothing refused reached the servicer
        finally:
            await server.stop(0)

    asyncio.run(scenario())


def test_a_token_minted_for_one_worker_is_refused_by_another() -> None:
    """The same member credential, two workers: a channel whose tokens name worker A opens
    A and nothing on B, even though both hold the secret."""

    async def scenario() -> None:
        (a, target_a, _), (b, target_b, servicer_b) = await _server(CRED), await _server(CRED)
        try:
            async with grpc.aio.insecure_channel(
                    target_b, interceptors=aio_interceptors(CRED, target_a)) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await worker_pb2_grpc.DecodeServiceStub(ch).Stats(worker_pb2.StatsRequest())
                assert _code(err) == grpc.StatusCode.UNAUTHENTICATED
            assert servicer_b.calls == []
        finally:
            await a.stop(0)
            await b.stop(0)

    asyncio.run(scenario())


def test_a_token_opens_its_own_method_and_request_once() -> None:
    """Tokens sent by hand (as a captured one would be): one minted for Abort("x") opens
    Abort("x") once; not Abort("y"), not Stats, not a second time; malformed tokens are
    UNAUTHENTICATED, never an error inside the server."""

    async def scenario() -> None:
        server, target, servicer = await _server(CRED)
        x = worker_pb2.AbortRequest(request_id="x")
        token = CRED.grpc_token(ABORT, target, request_digest(x.SerializeToString()))
        try:
            async with grpc.aio.insecure_channel(target) as ch:
                stub = worker_pb2_grpc.DecodeServiceStub(ch)

                async def abort(request: worker_pb2.AbortRequest, tok: object) -> grpc.StatusCode:
                    try:
                        await stub.Abort(request, metadata=((METADATA_KEY, tok),))
                    except grpc.aio.AioRpcError as err:
                        return err.code()
                    return grpc.StatusCode.OK

                y = worker_pb2.AbortRequest(request_id="y")
                assert await abort(y, token) == grpc.StatusCode.UNAUTHENTICATED  # other request
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.Stats(worker_pb2.StatsRequest(),
                                     metadata=((METADATA_KEY, token),))
                assert _code(err) == grpc.StatusCode.UNAUTHENTICATED  # other method
                assert await abort(x, token) == grpc.StatusCode.OK
                assert await abort(x, token) == grpc.StatusCode.UNAUTHENTICATED  # replayed
                ts = token.split(".")[1]
                for bad in ("garbage", "v2.2.aa.bb", f"v2.{ts}.x.y", "v2." * 50,
                            token.replace(ts, "1" * 13), "v1" + token[2:]):
                    assert await abort(x, bad) == grpc.StatusCode.UNAUTHENTICATED, bad
                # a member's request that does not parse: named, not an internal error
                fresh = CRED.grpc_token(ABORT, target, request_digest(b"\xff\xff"))
                call = ch.unary_unary(ABORT)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call(b"\xff\xff", metadata=((METADATA_KEY, fresh),))
                assert _code(err) == grpc.StatusCode.INVALID_ARGUMENT
            assert servicer.calls == ["Abort x"]
        finally:
            await server.stop(0)

    asyncio.run(scenario())


def test_sync_client_and_insecure_server() -> None:
    async def scenario() -> None:
        server, target, _ = await _server(CRED)
        open_server, open_target, _ = await _server(ClusterCredential.insecure_default())
        try:
            def calls() -> None:
                with sync_channel(grpc.insecure_channel(target), CRED, target) as ch:
                    stub = worker_pb2_grpc.DecodeServiceStub(ch)
                    assert stub.Stats(worker_pb2.StatsRequest(), timeout=10).num_blocks == 3
                    assert len(list(stub.Decode(worker_pb2.DecodeRequest(), timeout=10))) == 3
                localhost = target.replace("127.0.0.1", "localhost")  # the same socket's alias
                with sync_channel(grpc.insecure_channel(localhost), CRED, localhost) as ch:
                    stub = worker_pb2_grpc.DecodeServiceStub(ch)
                    assert stub.Stats(worker_pb2.StatsRequest(), timeout=10).num_blocks == 3
                with grpc.insecure_channel(open_target) as ch:  # --insecure: anyone
                    stub = worker_pb2_grpc.DecodeServiceStub(ch)
                    assert stub.Stats(worker_pb2.StatsRequest(), timeout=10).num_blocks == 3

            await asyncio.to_thread(calls)
        finally:
            await server.stop(0)
            await open_server.stop(0)

    asyncio.run(scenario())


def test_worker_audience_names_only_its_own_socket() -> None:
    names = worker_audience("10.1.2.3", 5001)
    assert names == {"10.1.2.3:5001"}
    loop = worker_audience("127.0.0.1", 5001)
    assert {"127.0.0.1:5001", "localhost:5001"} <= loop and "127.0.0.1:5002" not in loop
    assert "10.1.2.3:5001" not in loop
    assert "localhost:5001" in worker_audience("0.0.0.0", 5001)
