"""A client's request id in and out (X-Request-Id over HTTP, x-request-id over gRPC), hostile
ids refused at the edge, and the request's ids on the router's log lines."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from typing import Any

import aiohttp
import grpc
import pytest

from tandem.common.obs.log_format import setup_logging
from tandem.protos.v1 import tandem_pb2
from tandem.router.tokenizer import RouterTokenizer
from tests.unit.router.harness import MODEL, cluster

HEX_ID = re.compile(r"[0-9a-f]{32}")


def _url(c: Any, path: str = "/v1/completions") -> str:
    return f"http://127.0.0.1:{c.router.http_port}{path}"


def _body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Hello", "max_tokens": 3, **extra}


def _request(**kw: Any) -> tandem_pb2.GenerateRequest:
    return tandem_pb2.GenerateRequest(text="Hello", sampling=tandem_pb2.SamplingParams(
        max_tokens=3), **kw)


async def _raw_status(port: int, header_value: bytes) -> tuple[int, bytes]:
    """Status and headers of a request whose X-Request-Id is sent byte for byte."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps(_body()).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nX-Request-Id: " + header_value + b"\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
    await writer.drain()
    head = await reader.read(65536)
    writer.close()
    return int(head.split(b" ", 2)[1]), head.split(b"\r\n\r\n", 1)[0]


def test_http_request_ids_round_trip(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, http_port=0) as c, aiohttp.ClientSession() as http:
            async with http.post(_url(c), json=_body(),
                                 headers={"X-Request-Id": "client-42/a:b=c"}) as r:
                assert r.status == 200 and r.headers["X-Request-Id"] == "client-42/a:b=c"
                assert (await r.json())["id"] == "cmpl-client-42/a:b=c"
            async with http.post(_url(c), json=_body()) as r:  # none: the router's id
                minted = r.headers["X-Request-Id"]
                assert HEX_ID.fullmatch(minted) and (await r.json())["id"] == "cmpl-" + minted
            async with http.post(_url(c), json=_body(stream=True),
                                 headers={"X-Request-Id": "streamed"}) as r:
                assert r.status == 200 and r.headers["X-Request-Id"] == "streamed"
                await r.read()
            async with http.post(_url(c), json=_body(n=2)) as r:  # n choices: one id
                fanned = r.headers["X-Request-Id"]
                assert HEX_ID.fullmatch(fanned) and (await r.json())["id"] == "cmpl-" + fanned
            async with http.post(_url(c), json=_body(max_tokens=-1),
                                 headers={"X-Request-Id": "refused-but-named"}) as r:
                assert r.status == 400 and r.headers["X-Request-Id"] == "refused-but-named"
            async with http.get(_url(c, "/v1/models"), headers={"X-Request-Id": "m1"}) as r:
                assert r.status == 200 and r.headers["X-Request-Id"] == "m1"

    asyncio.run(scenario())


# (value, refused by our check: a JSON 400 naming the header; else by aiohttp's parser first)
HOSTILE = [(b"x" * 129, True), (b"y" * 5000, True), (b"two words", True), (b"caf\xc3\xa9", True),
           (b'quote"d', True), (b"tab\tin", True), (b"z" * 20000, False), (b"ctl\x01char", False),
           (b"esc\x1b[31m", False), (b"new\rline", False)]


@pytest.mark.parametrize(("value", "ours"), HOSTILE)
def test_hostile_http_request_ids_are_refused_and_never_echoed(
        tokenizer: RouterTokenizer, value: bytes, ours: bool) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, http_port=0) as c:
            status, head = await _raw_status(c.router.http_port, value)
            assert status == 400 or (status == 431 and not ours), head
            assert b"x-request-id" not in head.lower(), head
            assert (b"application/json" in head) == ours, head
            async with aiohttp.ClientSession() as http, http.post(_url(c), json=_body()) as r:
                assert r.status == 200  # the next client is served as ever

    asyncio.run(scenario())


def test_grpc_request_ids_in_metadata_and_field(tokenizer: RouterTokenizer) -> None:
    async def generate(c: Any, request: tandem_pb2.GenerateRequest,
                       metadata: tuple[tuple[str, str], ...] = ()) -> tuple[str, set[str]]:
        call = c.stub.Generate(request, metadata=metadata)
        echoed = dict(await call.initial_metadata())["x-request-id"]
        return echoed, {r.request_id async for r in call}

    async def scenario() -> None:
        async with cluster(tokenizer) as c:
            assert await generate(c, _request(), (("x-request-id", "md-1"),)) == (
                "md-1", {"md-1"})
            assert await generate(c, _request(request_id="field-1"),
                                  (("x-request-id", "md-2"),)) == ("field-1", {"field-1"})
            minted, ids = await generate(c, _request())
            assert HEX_ID.fullmatch(minted) and ids == {minted}
            for request, metadata, field in (
                    (_request(), (("x-request-id", "two words"),), "x-request-id"),
                    (_request(), (("x-request-id", "k" * 129),), "x-request-id"),
                    (_request(request_id="r" * 129), (), "request_id"),
                    (_request(request_id="new\nline"), (), "request_id")):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await c.generate(request, metadata=metadata)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert err.value.details().startswith(field + ":")

    asyncio.run(scenario())


def test_router_log_lines_name_the_request(tokenizer: RouterTokenizer) -> None:
    """A failing prefill worker is logged by the handoff, the request's end by its accounting:
    both lines carry the router's id and the client's; lines outside a request carry none."""
    out = io.StringIO()
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    setup_logging("json", "DEBUG", service="router", stream=out)

    async def scenario() -> str:
        async with cluster(tokenizer, http_port=0, placement="remote") as c, \
                aiohttp.ClientSession() as http:
            c.prefill[0].fail = True  # the handoff logs it, then prefills on the decode worker
            async with http.post(_url(c), json=_body(),
                                 headers={"X-Request-Id": "client-7"}) as r:
                assert r.status == 200
            return next(iter(c.decode[0].reservations))  # the first leg id: the router's id

    try:
        minted = asyncio.run(scenario())
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    ours = [line for line in lines if line.get("request_id")]
    assert {line["logger"] for line in ours} >= {"tandem.router.handoff.open_legs",
                                                "tandem.router.request_accounting"}
    assert all(line["request_id"] == minted and line["client_request_id"] == "client-7"
               for line in ours), ours
    assert any("left the pool" in line["message"] for line in ours)
    assert any(line["message"].startswith("finished (length)") for line in ours)
    assert any(not line.get("request_id") for line in lines)  # start-up, shutdown lines
