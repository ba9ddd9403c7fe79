"""The front door costs only its sender (gRPC edge): each hostile input gets its refusal at once
while a normal stream in flight completes untouched; the tokenizer runs after admission and
off the event loop; per-connection and per-key bounds; router-minted ids.

A "normal stream" here hangs in its decode leg until the test lets it go, so every refusal
provably happens while it is in flight.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest

from tandem.common.wire import RETRY_AFTER_KEY
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc
from tandem.router.tokenizer import RouterTokenizer
from tests.unit.router.fakes import expected_output
from tests.unit.router.harness import Cluster, cluster, until

S = tandem_pb2.SamplingParams
PROMPT = list(range(1000, 1040))
KEY, OTHER_KEY = "sk-front-door-one", "sk-front-door-two"
# Channels of one process share their connection unless told not to: this one has its own.
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


def _ids_request(n: int = 6, rid: str = "") -> tandem_pb2.GenerateRequest:
    return tandem_pb2.GenerateRequest(
        request_id=rid, token_ids=tandem_pb2.TokenIds(ids=PROMPT), sampling=S(max_tokens=n)
    )


async def _hanging(c: Cluster, stub: Any = None, **kw: Any) -> Any:
    """Start a normal 6-token stream and return its call once its decode leg hangs."""
    c.decode[0].hang_after = 1
    call = (stub or c.stub).Generate(_ids_request(), **kw)
    await call.read()  # the first token, from the prefill
    await asyncio.wait_for(c.decode[0].hanging.wait(), 10)
    return call


async def _finish(c: Cluster, call: Any) -> None:
    """Let the hanging stream go on; it must end with exactly its own tokens."""
    c.decode[0].resume.set()
    tokens = [t for r in [r async for r in call] for t in r.token_ids]
    assert tokens == expected_output(PROMPT, 6)[1:]


async def _refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value


class CountingTokenizer:
    """The real tokenizer, counting what reaches ``encode``; ``gate`` (when set) makes encode
    wait until the test sets it, in whatever thread encode runs."""

    def __init__(self, inner: RouterTokenizer) -> None:
        self._inner = inner
        self.encoded: list[str] = []
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.encoded.append(text)
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(30), "the test never released the tokenizer"
        return self._inner.encode(text, add_special_tokens)


def test_stop_limits_refused_while_a_stream_goes_on(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer) as c:
            normal = await _hanging(c)
            cases = [
                (S(stop=["x"] * 2000), "stop: 2000 stop strings; at most 4"),
                (S(stop=["y" * 1000]), "stop: a stop string of 1000 characters; at most 256"),
                (S(stop_token_ids=list(range(65))), "65 stop token ids; at most 64"),
            ]
            for sampling, why in cases:
                err = await _refused(c.generate(tandem_pb2.GenerateRequest(
                    text="hi", sampling=sampling)))
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and why in err.details()
            assert len(c.decode[0].reservations) == 1  # the refusals reached no worker
            await _finish(c, normal)

    asyncio.run(scenario())


def test_stop_limits_are_configurable(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, max_stop_strings=1, max_stop_chars=8) as c:
            err = await _refused(c.generate(tandem_pb2.GenerateRequest(
                text="hi", sampling=S(stop=["a", "b"]))))
            assert "at most 1" in err.details()
            out = await c.generate(tandem_pb2.GenerateRequest(
                text="hi", sampling=S(max_tokens=2, stop=["12345678"])))
            assert out[-1].finished

    asyncio.run(scenario())


def test_oversize_prompts_are_refused_without_tokenizing(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        counting = CountingTokenizer(tokenizer)
        async with cluster(counting, max_model_len=64) as c:  # type: ignore[arg-type]
            bound = tokenizer.max_token_chars
            assert bound is not None
            normal = await _hanging(c)
            huge = "x" * (bound * 64)  # at least 64 tokens: never fits a 64-token context
            err = await _refused(c.generate(tandem_pb2.GenerateRequest(text=huge)))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "at least 64 tokens" in err.details()
            err = await _refused(c.generate(tandem_pb2.GenerateRequest(
                text="x" * (bound * 32), sampling=S(max_tokens=40))))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "max_tokens" in err.details()
            err = await _refused(c.generate(tandem_pb2.GenerateRequest(
                token_ids=tandem_pb2.TokenIds(ids=[1] * 64))))
            assert "64 tokens; max_model_len is 64" in err.details()
            err = await _refused(c.stub.Tokenize(tandem_pb2.TokenizeRequest(text=huge)))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert counting.encoded == []  # none of them reached the tokenizer
            # A long text that may fit is tokenized, and refused only by its real count.
            err = await _refused(c.generate(tandem_pb2.GenerateRequest(text="hello " * 100)))
            assert "max_model_len is 64" in err.details() and len(counting.encoded) == 1
            await _finish(c, normal)

    asyncio.run(scenario())


def test_a_request_refused_by_admission_never_reaches_the_tokenizer(
    tokenizer: RouterTokenizer,
) -> None:
    async def scenario() -> None:
        counting = CountingTokenizer(tokenizer)
        async with cluster(counting, max_inflight=1, max_queue=0) as c:  # type: ignore[arg-type]
            normal = await _hanging(c)  # holds the only slot (token ids: no tokenizer)
            for request in (tandem_pb2.GenerateRequest(text="a flood of text " * 5000),
                            tandem_pb2.GenerateRequest(chat=tandem_pb2.ChatMessages(messages=[
                                tandem_pb2.ChatMessage(role="user", content="hi " * 5000)]))):
                err = await _refused(c.generate(request))
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert int(dict(err.trailing_metadata() or ())[RETRY_AFTER_KEY]) > 0
            assert counting.encoded == []
            await _finish(c, normal)
            out = await c.generate(tandem_pb2.GenerateRequest(text="hi", sampling=S(max_tokens=1)))
            assert out[-1].finished and counting.encoded == ["hi"]  # admitted: tokenized

    asyncio.run(scenario())


def test_tokenizing_runs_off_the_event_loop(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        counting = CountingTokenizer(tokenizer)
        counting.gate = threading.Event()
        async with cluster(counting) as c:  # type: ignore[arg-type]
            slow = asyncio.ensure_future(c.generate(tandem_pb2.GenerateRequest(
                text="a long prompt", sampling=S(max_tokens=2))))
            await until(counting.entered.is_set)  # in the tokenizer, which will not return ...
            # ... while the router answers everyone else.
            models = await c.stub.ListModels(tandem_pb2.ListModelsRequest())
            assert models.models
            out = await c.generate(_ids_request(n=2))
            assert [t for r in out for t in r.token_ids] == expected_output(PROMPT, 2)
            counting.gate.set()
            assert (await slow)[-1].finished

    asyncio.run(scenario())


def test_one_connection_is_bounded_others_are_not(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, max_inflight_per_connection=1) as c:
            normal = await _hanging(c)  # the harness's channel: one connection
            err = await _refused(c.generate(_ids_request(n=1)))
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "1 sequences in flight on this connection" in err.details()
            assert int(dict(err.trailing_metadata() or ())[RETRY_AFTER_KEY]) > 0
            port = c.router.port
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=OWN_CONNECTION) as other:
                stub = tandem_pb2_grpc.TandemStub(other)
                out = [r async for r in stub.Generate(_ids_request(n=1))]
                assert out[-1].finished  # another connection gets in
            await _finish(c, normal)
            out = await c.generate(_ids_request(n=1))  # the slot came back
            assert out[-1].finished

    asyncio.run(scenario())


def test_one_api_key_is_bounded_across_connections(
    tokenizer: RouterTokenizer, tmp_path: Path
) -> None:
    async def scenario() -> None:
        keys = tmp_path / "keys"
        keys.write_text(f"{KEY}\n{OTHER_KEY}\n")
        one = (("authorization", f"Bearer {KEY}"),)
        async with cluster(tokenizer, api_key_file=str(keys), max_inflight_per_key=1) as c:
            normal = await _hanging(c, metadata=one)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{c.router.port}",
                                         options=OWN_CONNECTION) as other:
                stub = tandem_pb2_grpc.TandemStub(other)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    [r async for r in stub.Generate(_ids_request(n=1), metadata=one)]
                assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "for this API key" in (err.value.details() or "")
                two = (("authorization", f"Bearer {OTHER_KEY}"),)
                out = [r async for r in stub.Generate(_ids_request(n=1), metadata=two)]
                assert out[-1].finished
            await _finish(c, normal)

    asyncio.run(scenario())


def test_oversize_grpc_message_is_resource_exhausted(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, max_request_bytes=64 * 1024) as c:
            normal = await _hanging(c)
            err = await _refused(c.generate(tandem_pb2.GenerateRequest(text="x" * 100_000)))
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            await _finish(c, normal)

    asyncio.run(scenario())


def test_a_duplicate_client_id_never_touches_the_first_request(
    tokenizer: RouterTokenizer,
) -> None:
    """Two requests with the same client id: each gets its own output and the id back; the
    workers never see the client's id; cancelling one aborts only its own legs."""

    async def scenario() -> None:
        async with cluster(tokenizer) as c:
            c.decode[0].hang_after = 1
            victim = c.stub.Generate(_ids_request(n=6, rid="dup"))
            head = await victim.read()
            await asyncio.wait_for(c.decode[0].hanging.wait(), 10)
            other_prompt = list(range(2000, 2030))
            twin = await c.generate(tandem_pb2.GenerateRequest(
                request_id="dup", token_ids=tandem_pb2.TokenIds(ids=other_prompt),
                sampling=S(max_tokens=1)))
            assert [t for r in twin for t in r.token_ids] == expected_output(other_prompt, 1)
            assert {r.request_id for r in twin} == {"dup"}
            third = c.stub.Generate(_ids_request(n=6, rid="dup"))
            await third.read()
            await third.read()  # into its decode leg
            third.cancel()  # the router aborts the third's legs ...
            await asyncio.wait_for(c.decode[0].aborted.wait(), 10)
            c.decode[0].resume.set()
            rest = [r async for r in victim]  # ... and the first still runs to its end
            tokens = [t for r in [head, *rest] for t in r.token_ids]
            assert tokens == expected_output(PROMPT, 6)
            assert {r.request_id for r in [head, *rest]} == {"dup"}
            seen = [*c.decode[0].reservations, *c.prefill[0].calls]
            legs = set(c.decode[0].reservations)
            assert len(legs) == 3 and "dup" not in seen  # three requests, three minted ids
            victim_leg = c.prefill[0].calls[0]
            assert victim_leg not in c.decode[0].aborts and victim_leg not in c.prefill[0].aborts

    asyncio.run(scenario())
