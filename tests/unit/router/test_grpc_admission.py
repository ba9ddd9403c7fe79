"""The gRPC door charges and caps as the HTTP one does: request caps on the message's repeated
fields before the plain request is built, Tokenize under the admission gate, and a stream
charged its prompt's tokens against its connection (real sockets, fake workers)."""

from __future__ import annotations

import asyncio

import grpc
from prometheus_client import generate_latest

from tandem.protos.v1 import tandem_pb2
from tandem.router.cost import Cost
from tandem.router.tokenizer import RouterTokenizer
from tests.scrape import parse, value
from tests.unit.router.harness import Cluster, cluster, until
from tests.unit.router.test_frontend import PROMPT, _finish, _hanging, _refused


def _chat(count: int) -> tandem_pb2.ChatMessages:
    return tandem_pb2.ChatMessages(
        messages=[tandem_pb2.ChatMessage(role="user", content="hi")] * count)


def test_caps_on_messages_and_token_ids_are_invalid_argument(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, max_messages=4) as c:
            normal = await _hanging(c)
            cases = [
                (c.generate(tandem_pb2.GenerateRequest(chat=_chat(5))), "5 messages; at most 4"),
                (c.generate(tandem_pb2.GenerateRequest(
                    token_ids=tandem_pb2.TokenIds(ids=[1] * 2049))), "2049 token ids"),
                (c.stub.Tokenize(tandem_pb2.TokenizeRequest(chat=_chat(5))), "5 messages"),
            ]
            for call, why in cases:
                err = await _refused(call)
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and why in err.details()
            ids = await c.stub.Tokenize(tandem_pb2.TokenizeRequest(chat=_chat(4)))
            assert ids.count > 0
            await _finish(c, normal)

    asyncio.run(scenario())


def _outcome(c: Cluster, outcome: str) -> float:
    text = generate_latest(c.router.metrics.registry).decode()
    return value(parse(text), "tandem_requests_total", outcome=outcome)


def test_generate_refused_by_the_caps_counts_as_invalid(tokenizer: RouterTokenizer) -> None:
    """A Generate the caps (or its request-id metadata) refuse is an invalid request in
    ``tandem_requests_total``, as the HTTP edge counts a body it refuses; a Tokenize is not a
    Generate request and is not counted."""
    async def scenario() -> None:
        async with cluster(tokenizer, max_messages=4) as c:
            refused = [
                c.generate(tandem_pb2.GenerateRequest(chat=_chat(5))),
                c.generate(tandem_pb2.GenerateRequest(
                    token_ids=tandem_pb2.TokenIds(ids=[1] * 2049))),
                c.stub.Generate(tandem_pb2.GenerateRequest(text="hi"),
                                metadata=(("x-request-id", "no spaces allowed"),)).read(),
            ]
            for call in refused:
                assert (await _refused(call)).code() == grpc.StatusCode.INVALID_ARGUMENT
            await _refused(c.stub.Tokenize(tandem_pb2.TokenizeRequest(chat=_chat(5))))
            assert _outcome(c, "invalid") == 3
            assert _outcome(c, "ok") == _outcome(c, "overloaded") == 0

    asyncio.run(scenario())


def test_tokenize_waits_its_turn_at_the_gate(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, max_inflight=1, max_queue=0) as c:
            normal = await _hanging(c)  # holds the only running sequence
            err = await _refused(c.stub.Tokenize(tandem_pb2.TokenizeRequest(text="hello")))
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "router overloaded" in (err.details() or "")
            await _finish(c, normal)
            await until(lambda: c.router.gate.idle)
            ids = await c.stub.Tokenize(tandem_pb2.TokenizeRequest(text="hello"))
            assert ids.count > 0 and c.router.gate.idle  # it gave its share back

    asyncio.run(scenario())


def test_a_stream_holds_its_prompt_tokens_on_its_connection(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, max_inflight_tokens_per_connection=2048) as c:
            normal = await _hanging(c)
            clients = c.router.frontend.clients
            prompt_len = len(PROMPT)
            assert [clients.in_flight(conn) for conn in list(clients._by_connection)] == [
                Cost(1, prompt_len)]
            assert c.router.gate.ledger.running_tokens == prompt_len
            big = tandem_pb2.GenerateRequest(token_ids=tandem_pb2.TokenIds(
                ids=[1] * (2049 - prompt_len)))  # with the stream's: one token over the bound
            err = await _refused(c.generate(big))
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "2048 prompt tokens in flight on this connection" in (err.details() or "")
            await _finish(c, normal)
            await until(lambda: not clients._by_connection)
            assert c.router.gate.ledger.running_tokens == 0

    asyncio.run(scenario())

