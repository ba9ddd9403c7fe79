"""The router's OpenAI HTTP API in front of fake workers: routes, shapes, status codes,
overload, deadline, draining and client disconnects (one event loop, real sockets)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tandem.common.wire import GRAMMAR_BUSY
from tandem.protos.v1 import tandem_pb2
from tandem.router.tokenizer import RouterTokenizer
from tests.unit.router.harness import MODEL, cluster, until

# A request deadline long enough that the request reaches its decode leg well before it on a
# loaded machine (the test waits for that leg to hang before the deadline may pass).
DEADLINE_S = 2.0


def _url(c: Any, path: str) -> str:
    return f"http://127.0.0.1:{c.router.http_port}{path}"


async def _events(response: aiohttp.ClientResponse) -> list[Any]:
    """Every SSE ``data:`` payload of a response, ``[DONE]`` included as a string."""
    out = []
    async for raw in response.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_completions_chat_models_health_and_metrics(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, http_port=0) as c, aiohttp.ClientSession() as http:
            c.decode[0].text_of = tokenizer.decode
            grpc_out = await c.generate(tandem_pb2.GenerateRequest(
                text="Hello", sampling=tandem_pb2.SamplingParams(max_tokens=5)))
            async with http.post(_url(c, "/v1/completions"),
                                 json={"model": MODEL, "prompt": "Hello", "max_tokens": 5}) as r:
                assert r.status == 200
                body = await r.json()
            assert body["object"] == "text_completion" and body["model"] == MODEL
            assert body["choices"][0]["text"] == "".join(m.text for m in grpc_out)
            assert body["choices"][0]["finish_reason"] == "length"
            assert body["usage"]["completion_tokens"] == 5
            request = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                       "stream": True, "stream_options": {"include_usage": True}}
            async with http.post(_url(c, "/v1/chat/completions"), json=request) as r:
                assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
                events = await _events(r)
            assert events[-1] == "[DONE]"
            usage = events[-2]
            assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3
            chunks = events[:-2]
            assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
            assert chunks[-1]["choices"][0]["finish_reason"] == "length"
            async with http.get(_url(c, "/v1/models")) as r:
                assert (await r.json())["data"][0]["id"] == MODEL
            async with http.get(_url(c, "/health")) as r:
                assert r.status == 200
            async with http.get(_url(c, "/metrics")) as r:
                assert r.status == 200
                names = {f.name for f in text_string_to_metric_families(await r.text())}
            assert any(name.startswith("tandem_") for name in names)

    asyncio.run(scenario())


def test_errors_come_in_openai_shape(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, http_port=0) as c, aiohttp.ClientSession() as http:
            cases = [
                ("POST", "/v1/completions", {"prompt": "x", "temperature": -1}, 400,
                 "temperature"),
                ("POST", "/v1/completions", {"prompt": "x", "n": 0}, 400, "n"),
                ("POST", "/v1/chat/completions",
                 {"messages": [{"role": "wizard", "content": "x"}]}, 400,
                 "chat.messages[0].role"),
                ("POST", "/v1/completions", {"prompt": "x", "model": "nope"}, 404, "model"),
                ("POST", "/v1/nothing", {}, 404, None),
                ("GET", "/v1/completions", None, 405, None),
            ]
            for method, path, body, status, param in cases:
                async with http.request(method, _url(c, path), json=body) as r:
                    assert r.status == status, (path, body, await r.text())
                    error = (await r.json())["error"]
                assert set(error) == {"message", "type", "param", "code"}
                assert error["param"] == param and error["message"]
            async with http.post(_url(c, "/v1/completions"), data=b"{not json") as r:
                assert r.status == 400 and (await r.json())["error"]["param"] == "body"
            # The gRPC edge says the same thing for the same bad field (one validator).
            grpc_err = None
            try:
                await c.generate(tandem_pb2.GenerateRequest(
                    text="x", sampling=tandem_pb2.SamplingParams(temperature=-1)))
            except Exception as exc:  # grpc.aio.AioRpcError
                grpc_err = exc
            async with http.post(_url(c, "/v1/completions"),
                                 json={"prompt": "x", "temperature": -1}) as r:
                assert (await r.json())["error"]["message"] == grpc_err.details()  # type: ignore[union-attr]

    asyncio.run(scenario())


def test_overload_429_then_disconnect_cancels_both_legs(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, http_port=0, max_inflight=1, max_queue=0) as c, \
                aiohttp.ClientSession() as http:
            c.decode[0].hang_after = 1
            body = {"prompt": "Hello", "max_tokens": 50, "stream": True}
            first = await http.post(_url(c, "/v1/completions"), json=body)
            assert first.status == 200
            await first.content.readline()  # the first event: the request is admitted
            await asyncio.wait_for(c.decode[0].hanging.wait(), 10)
            async with http.post(_url(c, "/v1/completions"), json=body) as r:
                assert r.status == 429
                assert int(r.headers["Retry-After"]) >= 1 and r.headers["Retry-After-Ms"]
                assert (await r.json())["error"]["type"] == "rate_limit_error"
            first.close()  # the client goes away mid-stream
            await asyncio.wait_for(c.decode[0].aborted.wait(), 10)
            await until(lambda: c.router.gate.idle)  # the slot comes back once the handler unwinds
            assert c.counters.cancelled == 1
            c.decode[0].hang_after = None
            async with http.post(_url(c, "/v1/completions"),
                                 json={"prompt": "Hello", "max_tokens": 2}) as r:
                assert r.status == 200

    asyncio.run(scenario())


def test_deadline_504_and_draining_503(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, http_port=0) as c, aiohttp.ClientSession() as http:
            c.decode[0].hang_after = 1

            async def late() -> tuple[int, str]:
                async with http.post(_url(c, "/v1/completions"),
                                     json={"prompt": "Hello", "max_tokens": 20},
                                     headers={"X-Tandem-Timeout": str(DEADLINE_S)}) as r:
                    return r.status, await r.text()

            call = asyncio.ensure_future(late())
            # Both legs are open (the decode stream hangs) before the deadline passes.
            await asyncio.wait_for(c.decode[0].hanging.wait(), DEADLINE_S)
            status, text = await call
            assert status == 504, text
            assert json.loads(text)["error"]["type"] == "timeout_error"
            await asyncio.wait_for(c.decode[0].aborted.wait(), 10)
            async with http.post(_url(c, "/v1/completions"), json={"prompt": "x"},
                                 headers={"X-Tandem-Timeout": "soon"}) as r:
                assert r.status == 400
            await c.router.stop_accepting()
            async with http.post(_url(c, "/v1/completions"), json={"prompt": "x"}) as r:
                assert r.status == 503
                assert (await r.json())["error"]["type"] == "service_unavailable_error"
            async with http.get(_url(c, "/health")) as r:
                assert r.status == 503

    asyncio.run(scenario())


def test_failure_after_the_headers_is_an_error_event(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, http_port=0, max_migrations=0) as c, \
                aiohttp.ClientSession() as http:
            c.decode[0].die_after = 2
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20,
                    "stream": True}
            async with http.post(_url(c, "/v1/chat/completions"), json=body) as r:
                assert r.status == 200
                events = await _events(r)
            assert events[-1] == "[DONE]"
            error = events[-2]["error"]
            assert error["type"] == "service_unavailable_error" and error["message"]
            assert all("choices" in e for e in events[:-2]) and len(events) > 2

    asyncio.run(scenario())


def test_a_grammar_still_compiling_is_429_with_its_own_code(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, http_port=0) as c, aiohttp.ClientSession() as http:
            c.decode[0].exhausted, c.decode[0].retry_hint_ms = True, 1500
            c.decode[0].busy = GRAMMAR_BUSY
            body = {"prompt": "Hello", "max_tokens": 2}
            async with http.post(_url(c, "/v1/completions"), json=body) as r:
                assert r.status == 429
                assert (r.headers["Retry-After"], r.headers["Retry-After-Ms"]) == ("2", "1500")
                error = (await r.json())["error"]
            assert (error["type"], error["code"]) == ("rate_limit_error", "grammar_compiling")
            assert "grammar is still compiling" in error["message"]
            c.decode[0].busy = None  # plain load keeps its own code
            async with http.post(_url(c, "/v1/completions"), json=body) as r:
                assert r.status == 429
                error = (await r.json())["error"]
            assert error["code"] == "resource_exhausted"
            assert "every decode worker is full" in error["message"]

    asyncio.run(scenario())
