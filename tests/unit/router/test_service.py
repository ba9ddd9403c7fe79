"""The router's other public surfaces: chat and logprobs, Tokenize, ListModels, and the drain.

The Registry service and health probing are tested under membership/."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tandem.protos.v1 import tandem_pb2
from tandem.router.api.chat import Chat, ChatMessage
from tandem.router.tokenizer import RouterTokenizer
from tests.unit.router.fakes import expected_output
from tests.unit.router.harness import MODEL, cluster

CHAT = tandem_pb2.ChatMessages(
    messages=[tandem_pb2.ChatMessage(role="user", content="What is 2+2?")],
    add_generation_prompt=True,
)
PLAIN_CHAT = Chat((ChatMessage(role="user", content="What is 2+2?"),), add_generation_prompt=True)


def test_chat_prompt_goes_through_the_template(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer) as c:
            ids = tokenizer.encode_chat(PLAIN_CHAT)
            assert tokenizer.decode(ids, skip_special_tokens=False).rstrip().endswith("assistant")
            request = tandem_pb2.GenerateRequest(
                chat=CHAT,
                sampling=tandem_pb2.SamplingParams(max_tokens=3),
                logprobs=tandem_pb2.LogprobOptions(enabled=True),
            )
            responses = await c.generate(request)
            assert [t for r in responses for t in r.token_ids] == expected_output(ids, 3)
            assert responses[-1].usage.prompt_tokens == len(ids)
            assert responses[0].logprobs[0].token_id == responses[0].token_ids[0]
            assert len(responses[0].request_id) == 32  # minted

    asyncio.run(scenario())


def test_tokenize_and_list_models(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer) as c:
            reply = await c.stub.Tokenize(tandem_pb2.TokenizeRequest(text="Hello world"))
            assert list(reply.token_ids) == tokenizer.encode("Hello world", False)
            assert reply.count == len(reply.token_ids)
            reply = await c.stub.Tokenize(tandem_pb2.TokenizeRequest(chat=CHAT))
            assert list(reply.token_ids) == tokenizer.encode_chat(PLAIN_CHAT)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.stub.Tokenize(tandem_pb2.TokenizeRequest(model="other", text="x"))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            models = await c.stub.ListModels(tandem_pb2.ListModelsRequest())
            assert [(m.id, m.max_model_len) for m in models.models] == [(MODEL, 2048)]

    asyncio.run(scenario())


def test_drain_refuses_new_work_and_finishes_in_flight(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer) as c:
            health = health_pb2_grpc.HealthStub(c.channel)
            check = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert check.status == health_pb2.HealthCheckResponse.SERVING
            reflect = reflection_pb2_grpc.ServerReflectionStub(c.channel)
            replies = reflect.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")])
            )
            names = {s.name async for r in replies for s in r.list_services_response.service}
            assert {"tandem.v1.Tandem", "tandem.v1.Registry"} <= names
            c.decode[0].hang_after = 1
            call = c.stub.Generate(tandem_pb2.GenerateRequest(text="hi"))
            await call.read()
            await asyncio.wait_for(c.decode[0].hanging.wait(), 10)
            await c.router.stop_accepting()
            drain = asyncio.ensure_future(c.router.drain())
            check = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert check.status == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.generate(tandem_pb2.GenerateRequest(text="hi"))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert not drain.done()
            c.decode[0].resume.set()
            last = await call.read()
            while last is not grpc.aio.EOF and not last.finished:
                last = await call.read()
            assert last is not grpc.aio.EOF and last.finished
            assert await asyncio.wait_for(drain, 10)

    asyncio.run(scenario())
