"""Bodies built to take the router's capacity, against a real router (default admission
flags) + tiny-model prefill and decode workers: a 256-prompt x n=128 fan-out, 100,000 chat
messages, 700,000 token ids and a JSON array nested a million deep are refused at once with
a 400 naming their limit; a flood of /tokenize calls of large chats is served or refused with
429 (parsed in the bounded pool, tokenized under admission), never a 5xx. A normal request
sent among them is served, no worker is marked down, and the workers end idle."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from tests import scrape
from tests.integration.sdk_cluster import LocalCluster, assert_idle, start_router_on
from tests.integration.served_model import MODEL_ID, TinyWorkers

FLOOD = 48  # concurrent /tokenize calls: more than the parse pool's threads and queue
USER = {"role": "user", "content": "hello there"}
# Every hostile body, the parameter its 400 names and what its message says.
REFUSED: list[tuple[str, str, str, str]] = [
    ("/v1/completions",
     json.dumps({"model": MODEL_ID, "prompt": ["hi"] * 256, "n": 128, "max_tokens": 1}),
     "prompt", "256 prompts x 128 = 32768 sequences; at most 128 per request (--max-fanout)"),
    ("/v1/chat/completions",
     json.dumps({"model": MODEL_ID, "messages": [{"role": "user", "content": "x"}] * 100_000},
                separators=(",", ":")),
     "messages", "100000 messages; at most 2048 (--max-messages)"),
    ("/v1/completions",
     json.dumps({"model": MODEL_ID, "prompt": [1000] * 700_000}, separators=(",", ":")),
     "prompt", "700000 token ids; at most 1024 (the context length)"),
    ("/tokenize", "[" * 1_000_000 + "]" * 1_000_000, "body", "nested deeper than 128"),
]


@pytest.fixture(scope="module")
def local(tiny_workers: TinyWorkers) -> Iterator[LocalCluster]:
    """A router with the default admission flags on the shared tiny workers."""
    local = start_router_on(tiny_workers)
    try:
        yield local
    finally:
        local.cluster.stop()


async def _post(http: aiohttp.ClientSession, base: str, path: str, data: str
                ) -> tuple[int, Any]:
    async with http.post(base + path, data=data,
                         headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.json()


async def _normal(http: aiohttp.ClientSession, base: str) -> tuple[int, Any]:
    body = {"model": MODEL_ID, "messages": [USER], "max_tokens": 4, "temperature": 0,
            "ignore_eos": True}
    return await _post(http, base, "/v1/chat/completions", json.dumps(body))


async def _scenario(base: str) -> None:
    connector = aiohttp.TCPConnector(force_close=True, limit=0)  # a connection per request
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        # The refusals first, each answered before the flood starts: a flood that fills the
        # parse pool first would (rightly) answer a large refused body 429, not its 400.
        for path, body, param, why in REFUSED:
            status, answer = await _post(http, base, path, body)
            assert status == 400, (path, answer)
            assert answer["error"]["param"] == param and why in answer["error"]["message"]
        chat = json.dumps({"model": MODEL_ID, "messages": [USER] * 2000})  # ~90 KB: the pool
        flood = [asyncio.ensure_future(_post(http, base, "/tokenize", chat))
                 for _ in range(FLOOD)]
        fanned = asyncio.ensure_future(_post(http, base, "/v1/completions", json.dumps(
            {"model": MODEL_ID, "prompt": ["Hello", "The sky"], "n": 4, "max_tokens": 2})))
        # Sent among them: served, with no 503 (a generous bound on "does not hang").
        status, body = await asyncio.wait_for(_normal(http, base), 120)
        assert status == 200, body
        assert body["choices"][0]["message"]["content"] is not None
        assert body["usage"]["completion_tokens"] == 4
        statuses = [status for status, _ in await asyncio.gather(*flood)]
        assert set(statuses) <= {200, 429}, statuses
        status, body = await fanned  # a fan-out within the caps is served whole
        assert status == 200 and len(body["choices"]) == 2 * 4, body
        status, body = await _normal(http, base)  # and after them all, again
        assert status == 200, body


def test_hostile_bodies_are_refused_or_bounded_and_a_normal_request_is_served(
        local: LocalCluster) -> None:
    assert local.router is not None
    http = local.router.info["http"]
    asyncio.run(_scenario(f"http://{http}"))
    samples = scrape.parse(scrape.fetch(http))
    for role in ("decode", "prefill"):  # nobody took a worker out of the pool
        assert scrape.value(samples, "tandem_workers", worker_role=role, routable="false") == 0
    # The three generation bodies (a /tokenize call is not a generation request).
    assert scrape.value(samples, "tandem_requests_total", outcome="invalid") == 3
    assert_idle(local)
