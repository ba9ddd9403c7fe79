"""API keys: the key file, the Bearer check, and both edges of a real router refusing calls
without a valid key while health (and the workers' Registry) stay open."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tandem.protos.v1 import tandem_pb2, worker_pb2
from tandem.router.auth import ApiKeyFileError, ApiKeys
from tandem.router.tokenizer import RouterTokenizer
from tests.unit.router.harness import cluster

KEY = "sk-test-0123456789"


def _key_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys"
    path.write_text(f"# the test's keys\n\n{KEY}  # primary\nsk-other\n")
    return path


def test_key_file_and_bearer_check(tmp_path: Path) -> None:
    keys = ApiKeys.from_file(_key_file(tmp_path))
    assert len(keys) == 2
    assert keys.allows(f"Bearer {KEY}") and keys.allows("bearer sk-other")
    for bad in (None, "", KEY, f"Bearer {KEY}x", "Bearer ", "Basic sk-other", "Bearer sk-"):
        assert not keys.allows(bad), bad
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n\n")
    with pytest.raises(ApiKeyFileError, match="no key"):
        ApiKeys.from_file(empty)
    with pytest.raises(ApiKeyFileError, match="cannot read"):
        ApiKeys.from_file(tmp_path / "missing")


def test_grpc_and_http_refuse_without_a_key(tokenizer: RouterTokenizer, tmp_path: Path) -> None:
    async def scenario() -> None:
        keys = str(_key_file(tmp_path))
        async with cluster(tokenizer, http_port=0, api_key_file=keys) as c, \
                aiohttp.ClientSession() as http:
            calls = {
                "Generate": lambda md: c.generate(tandem_pb2.GenerateRequest(text="hi"),
                                                  metadata=md),
                "Tokenize": lambda md: c.stub.Tokenize(tandem_pb2.TokenizeRequest(text="hi"),
                                                       metadata=md),
                "ListModels": lambda md: c.stub.ListModels(tandem_pb2.ListModelsRequest(),
                                                           metadata=md),
            }
            for name, call in calls.items():
                for md in ((), (("authorization", "Bearer wrong"),)):
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await call(md)
                    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, name
                assert await call((("authorization", f"Bearer {KEY}"),)), name
            health = health_pb2_grpc.HealthStub(c.channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            routes = [("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}),
                      ("POST", "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
                      ("GET", "/v1/models", None), ("GET", "/metrics", None)]
            base = f"http://127.0.0.1:{c.router.http_port}"
            for method, path, body in routes:
                for headers in ({}, {"Authorization": "Bearer wrong"}):
                    async with http.request(method, base + path, json=body,
                                            headers=headers) as r:
                        assert r.status == 401, path
                        error = (await r.json())["error"]
                        assert error["code"] == "invalid_api_key"
                        assert KEY not in await r.text()
                async with http.request(method, base + path, json=body,
                                        headers={"Authorization": f"Bearer {KEY}"}) as r:
                    assert r.status == 200, (path, await r.text())
            async with http.get(base + "/health") as r:
                assert r.status == 200

    asyncio.run(scenario())


def test_registry_needs_the_credential_not_a_key(tokenizer: RouterTokenizer,
                                                 tmp_path: Path) -> None:
    """Workers register with the cluster credential, not an API key (they are not clients)."""
    from tandem.protos.v1 import worker_pb2_grpc

    async def scenario() -> None:
        async with cluster(tokenizer, n_prefill=0, n_decode=0,
                           api_key_file=str(_key_file(tmp_path))) as c:
            registry = worker_pb2_grpc.RegistryStub(c.channel)
            reply = await registry.Register(worker_pb2.RegisterRequest(
                role=worker_pb2.ROLE_DECODE, worker_id="w", endpoint="127.0.0.1:1"))
            assert reply.heartbeat_interval_s > 0

    asyncio.run(scenario())


def test_a_metrics_key_opens_metrics_only(tokenizer: RouterTokenizer, tmp_path: Path) -> None:
    """A scraper's key (``--metrics-key-file``) reads /metrics and nothing else; API keys still
    read /metrics; with metrics keys alone the API stays open and /metrics needs one."""
    scraper = "metrics-scraper-token"
    metrics_file = tmp_path / "metrics-key"
    metrics_file.write_text(f"{scraper}\n")

    async def get(http: aiohttp.ClientSession, url: str, key: str | None) -> int:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with http.get(url, headers=headers) as r:
            await r.read()
            return r.status

    async def scenario() -> None:
        async with cluster(tokenizer, http_port=0, api_key_file=str(_key_file(tmp_path)),
                           metrics_key_file=str(metrics_file)) as c, \
                aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{c.router.http_port}"
            assert await get(http, base + "/metrics", scraper) == 200
            assert await get(http, base + "/metrics", KEY) == 200
            assert await get(http, base + "/metrics", None) == 401
            assert await get(http, base + "/metrics", "wrong") == 401
            assert await get(http, base + "/v1/models", scraper) == 401
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.stub.ListModels(tandem_pb2.ListModelsRequest(),
                                        metadata=(("authorization", f"Bearer {scraper}"),))
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        async with cluster(tokenizer, http_port=0, metrics_key_file=str(metrics_file)) as c, \
                aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{c.router.http_port}"
            assert await get(http, base + "/v1/models", None) == 200
            assert await get(http, base + "/metrics", None) == 401
            assert await get(http, base + "/metrics", scraper) == 200

    asyncio.run(scenario())
