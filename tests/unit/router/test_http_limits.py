"""The HTTP edge's limits: stop strings (400), body size (413), a slow client's head or body
(cut / 408), per-key concurrency by cost (429 + Retry-After), caps on fan-out, messages,
token ids and nesting (400), /tokenize under admission and the client limits, open
connections per address (429), each while a normal stream in flight completes untouched
(real sockets, fake workers)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp

from tandem.router.http.body_pool import INLINE_BYTES
from tandem.router.tokenizer import RouterTokenizer
from tests.unit.router.harness import MODEL, Cluster, cluster, until
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


def test_caps_on_fanout_messages_token_ids_and_nesting_are_400(
        tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, http_port=0, max_messages=4, max_fanout=16) as c, \
                _session() as http:
            normal = await _hanging(c)
            user = {"role": "user", "content": "hi"}
            cases = [
                ("/v1/completions", {"prompt": ["a"] * 8, "n": 4}, "prompt",
                 "8 prompts x 4 = 32 sequences; at most 16 per request (--max-fanout)"),
                ("/v1/chat/completions", {"messages": [user], "n": 17}, "n", "17 sequences"),
                ("/v1/chat/completions", {"messages": [user] * 5}, "messages",
                 "5 messages; at most 4 (--max-messages)"),
                ("/v1/completions", {"prompt": [1] * 2049}, "prompt",
                 "2049 token ids; at most 2048"),
                ("/tokenize", {"messages": [user] * 5}, "messages", "5 messages"),
                ("/detokenize", {"tokens": [1] * 2049}, "tokens", "2049 token ids"),
            ]
            for path, body, param, why in cases:
                async with http.post(_url(c, path), json=body) as r:
                    error = (await r.json())["error"]
                    assert r.status == 400 and error["param"] == param, (path, error)
                    assert why in error["message"]
            for path in ("/v1/completions", "/tokenize"):
                deep = "[" * 100_000 + "]" * 100_000  # a RecursionError once: a 500
                async with http.post(_url(c, path), data=deep,
                                     headers={"Content-Type": "application/json"}) as r:
                    error = (await r.json())["error"]
                    assert r.status == 400 and error["param"] == "body"
                    assert "nested deeper than 128" in error["message"]
            status, _, body = await _post(http, c, {"prompt": "hi", "max_tokens": 1})
            assert status == 200 and body["choices"]
            await _finish(c, normal)

    asyncio.run(scenario())


def test_a_large_body_is_parsed_in_the_pool(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, http_port=0) as c, _session() as http:
            padded = json.dumps({"prompt": "hi", "max_tokens": 1}) + " " * (INLINE_BYTES + 1)
            async with http.post(_url(c, "/v1/completions"), data=padded,
                                 headers={"Content-Type": "application/json"}) as r:
                assert r.status == 200 and (await r.json())["choices"]
            assert c.router.http is not None
            pool = c.router.http._parse
            await until(lambda: pool.pending == 0)
            assert pool.rejected == 0

    asyncio.run(scenario())


def test_tokenize_passes_admission_and_the_client_limits(tokenizer: RouterTokenizer,
                                                          tmp_path: Path) -> None:
    async def scenario() -> None:
        keys = tmp_path / "keys"
        keys.write_text(f"{KEY}\n{OTHER_KEY}\nsk-http-three\n")
        one = {"Authorization": f"Bearer {KEY}"}
        two = {"Authorization": f"Bearer {OTHER_KEY}"}
        three = {"Authorization": "Bearer sk-http-three"}
        async with cluster(tokenizer, http_port=0, api_key_file=str(keys), max_inflight=2,
                           max_queue=0, max_inflight_per_key=1) as c, _session() as http:
            normal = await _hanging(c, metadata=tuple((k.lower(), v) for k, v in one.items()))
            # The key's one sequence is taken: its /tokenize and /detokenize wait for nothing.
            for path, body in (("/tokenize", {"prompt": "hello"}),
                               ("/detokenize", {"tokens": [1, 2]})):
                async with http.post(_url(c, path), json=body, headers=one) as r:
                    error = (await r.json())["error"]
                    assert r.status == 429 and "for this API key" in error["message"]
            # Another key's tokenize passes the gate (the second running slot) ...
            async with http.post(_url(c, "/tokenize"), json={"prompt": "hello"},
                                 headers=two) as r:
                assert r.status == 200 and (await r.json())["count"] > 0
            # ... and a generation by that key takes it; then a third key's tokenize finds the
            # router full.
            c.decode[0].hang_after = 1
            gen = await http.post(_url(c, "/v1/completions"), headers=two,
                                  json={"prompt": "Hello", "max_tokens": 6, "stream": True})
            assert gen.status == 200
            await gen.content.readline()
            await until(lambda: c.router.gate.ledger.running == 2)
            async with http.post(_url(c, "/tokenize"), json={"prompt": "x"}, headers=three) as r:
                assert r.status == 429 and "router overloaded" in (await r.json())["error"][
                    "message"]
            c.decode[0].resume.set()
            [line async for line in gen.content]
            gen.close()
            await _finish(c, normal)
            await until(lambda: c.router.gate.idle)
            async with http.post(_url(c, "/detokenize"), json={"tokens": [1, 2]},
                                 headers=one) as r:
                assert r.status == 200 and "prompt" in await r.json()

    asyncio.run(scenario())


def test_a_key_is_charged_every_sequence_of_a_request(tokenizer: RouterTokenizer,
                                                       tmp_path: Path) -> None:
    async def scenario() -> None:
        keys = tmp_path / "keys"
        keys.write_text(f"{KEY}\n")
        one = {"Authorization": f"Bearer {KEY}"}
        async with cluster(tokenizer, http_port=0, api_key_file=str(keys),
                           max_inflight_per_key=4) as c, _session() as http:
            normal = await _hanging(c, metadata=(("authorization", f"Bearer {KEY}"),))
            status, headers, body = await _post(http, c, {"prompt": "hi", "n": 4}, headers=one)
            assert status == 429 and "4 sequences in flight for this API key" in body[
                "error"]["message"] and int(headers["Retry-After"]) >= 1
            status, _, body = await _post(http, c, {"prompt": "hi", "n": 5}, headers=one)
            assert status == 400 and body["error"]["param"] == "n"
            assert "5 sequences (at most 4)" in body["error"]["message"]
            assert "--max-inflight-per-key" in body["error"]["message"]
            await _finish(c, normal)

    asyncio.run(scenario())


def test_one_address_is_capped_in_open_connections(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, http_port=0, max_connections_per_address=2) as c, \
                _session() as http:
            assert c.router.http is not None and c.router.http.connections is not None
            connections = c.router.http.connections
            idle = [await asyncio.open_connection("127.0.0.1", c.router.http_port)
                    for _ in range(2)]
            await until(lambda: connections.open_count("127.0.0.1") == 2)
            reply = await _raw(c, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            assert reply.startswith(b"HTTP/1.1 429") and b"Retry-After: 1" in reply
            assert b"too_many_connections" in reply and connections.rejected == 1
            _, writer = idle.pop()
            writer.close()
            await until(lambda: connections.open_count("127.0.0.1") == 1)
            status, _, body = await _post(http, c, {"prompt": "hi", "max_tokens": 1})
            assert status == 200 and body["choices"]
            for _, writer in idle:
                writer.close()

    asyncio.run(scenario())
