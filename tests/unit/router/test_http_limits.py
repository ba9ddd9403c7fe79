"""The HTTP edge's limits: stop strings (400), body size (413), a slow client's head or body
(cut / 408), per-key concurrency (429 + Retry-After), each while a normal stream in flight
completes untouched (real sockets, fake workers)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp

from tandem.router.tokenizer import RouterTokenizer
from tests.unit.router.harness import MODEL, Cluster, cluster
from tests.unit.router.test_frontend import _finish, _hanging

KEY, OTHER_KEY = "sk-http-one", "sk-http-two"


def _url(c: Cluster, path: str) -> str:
    return f"http://127.0.0.1:{c.router.http_port}{path}"


def _session() -> aiohttp.ClientSession:
    # A connection per request: the short read timeouts here close idle ones quickly.
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


async def _post(http: aiohttp.ClientSession, c: Cluster, body: Any, **kw: Any
                ) -> tuple[int, dict[str, Any], Any]:
    async with http.post(_url(c, "/v1/completions"), **kw, json=body) as r:
        return r.status, dict(r.headers), await r.json()


def test_stop_limits_are_400_with_the_reason(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, http_port=0) as c, _session() as http:
            normal = await _hanging(c)
            cases = [
                ({"stop": ["x"] * 2000}, "stop", "2000 stop strings; at most 4"),
                ({"stop": ["y" * 1000]}, "stop", "1000 characters; at most 256"),
                ({"stop_token_ids": list(range(65))}, "stop_token_ids", "at most 64"),
            ]
            for extra, param, why in cases:
                status, _, body = await _post(http, c, {"prompt": "hi", **extra})
                assert status == 400 and body["error"]["param"] == param
                assert why in body["error"]["message"]
            status, _, body = await _post(http, c, {"model": MODEL, "prompt": "hi",
                                                    "max_tokens": 2, "stop": ["a", "b"]})
            assert status == 200 and body["usage"]["completion_tokens"] <= 2
            await _finish(c, normal)

    asyncio.run(scenario())


def test_a_body_over_the_limit_is_413(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, http_port=0, max_request_bytes=64 * 1024) as c, \
                _session() as http:
            normal = await _hanging(c)
            status, _, body = await _post(http, c, {"prompt": "x" * 100_000})
            assert status == 413
            error = body["error"]
            assert error["param"] == "body" and error["code"] == "request_too_large"
            assert "65536 bytes" in error["message"]
            status, _, _ = await _post(http, c, {"prompt": "hi", "max_tokens": 1})
            assert status == 200
            await _finish(c, normal)

    asyncio.run(scenario())


async def _raw(c: Cluster, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection and never more; return all the server sends until
    it closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", c.router.http_port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 30)  # EOF: the server cut us off
    finally:
        writer.close()


def test_a_client_that_trickles_its_head_or_body_is_cut_off(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, http_port=0, http_read_timeout_s=1.0) as c, \
                _session() as http:
            normal = await _hanging(c)
            head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: applic"
            assert await _raw(c, head) == b""  # never answered, just closed
            partial_body = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                            b'{"prompt": "')
            reply = await _raw(c, partial_body)
            assert reply.startswith(b"HTTP/1.1 408") and b"request_timeout" in reply
            status, _, body = await _post(http, c, {"prompt": "hi", "max_tokens": 1})
            assert status == 200 and body["choices"]
            await _finish(c, normal)

    asyncio.run(scenario())


def test_one_api_key_is_bounded_429(tokenizer: RouterTokenizer, tmp_path: Path) -> None:
    async def scenario() -> None:
        keys = tmp_path / "keys"
        keys.write_text(f"{KEY}\n{OTHER_KEY}\n")
        one = {"Authorization": f"Bearer {KEY}"}
        async with cluster(tokenizer, http_port=0, api_key_file=str(keys),
                           max_inflight_per_key=1) as c, _session() as http:
            c.decode[0].hang_after = 1
            stream = await http.post(_url(c, "/v1/completions"), headers=one,
                                     json={"prompt": "Hello", "max_tokens": 6, "stream": True})
            assert stream.status == 200
            await stream.content.readline()  # admitted, holding the key's one slot
            await asyncio.wait_for(c.decode[0].hanging.wait(), 10)
            status, headers, body = await _post(http, c, {"prompt": "hi"}, headers=one)
            assert status == 429 and int(headers["Retry-After"]) >= 1
            assert body["error"]["type"] == "rate_limit_error"
            assert "for this API key" in body["error"]["message"]
            two = {"Authorization": f"Bearer {OTHER_KEY}"}
            status, _, _ = await _post(http, c, {"prompt": "hi", "max_tokens": 1}, headers=two)
            assert status == 200
            c.decode[0].resume.set()
            events = [line async for line in stream.content if line.strip()]
            assert events[-1].strip() == b"data: [DONE]"
            stream.close()

    asyncio.run(scenario())
