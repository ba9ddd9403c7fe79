"""A structured output whose grammar is too costly to compile costs its sender a 400 and nobody
else anything, against real routers and tiny-model workers (SmolLM2's 49k vocabulary, where
the 2,000-optional-property schema takes 14-27 s of CPU to compile).

    router (default limits) ─┐
                             ├─> prefill + decode workers, 0.5 s CPU compile budget
    router (limits lifted) ──┘

With the default limits the router refuses that schema itself, naming the limit; with them
lifted it reaches the decode worker, whose compile runs past the budget and is refused (the
refusal remembered: a repeat is refused again without a compile). Either way every worker
stays in both routers' pools and a normal structured request right after is served.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from tandem.launcher.local_cluster import Cluster, Proc
from tests import scrape
from tests.integration.sdk_cluster import LocalCluster, assert_idle
from tests.integration.served_model import start_workers, tiny_served_model

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 10},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
HEAVY = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(2000)}}
# Well past the budget: a compile refused must be, and neither wait may reach the router's
# 30 s RPC timeout (the wait bounds Reserve however slowly the niced compile thread runs).
BUDGET = ("--grammar-compile-budget-s", "0.5", "--grammar-compile-wait-s", "25")
LIFTED = ("--grammar-max-properties", "5000", "--grammar-max-schema-nodes", "10000")
RPC_TIMEOUT_S = 30.0  # the router's default --rpc-timeout-s


@pytest.fixture(scope="module")
def local(tiny_dir, smollm2_dir) -> Iterator[dict[str, Any]]:
    model = tiny_served_model(tiny_dir, smollm2_dir)
    c = Cluster()
    try:
        decode, prefill = start_workers(c, model, *BUDGET)
        lc = LocalCluster(c, model, prefill, decode)
        yield {"cluster": lc, "limited": lc.start_router(), "lifted": lc.start_router(*LIFTED)}
    finally:
        c.stop()


def _chat(router: Proc, schema: dict[str, Any]) -> tuple[int, Any, float]:
    """POST a chat completion constrained to ``schema``: (status, body, seconds taken)."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Describe a person."}],
            "max_tokens": 60, "temperature": 0.0,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "x", "schema": schema}}}
    req = urllib.request.Request(f"http://{router.info['http']}/v1/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read()), time.monotonic() - t0
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), time.monotonic() - t0


def _unroutable(local: dict[str, Any]) -> dict[str, float]:
    """Workers each router holds out of its pool, by router and role (all 0: none)."""
    out = {}
    for name in ("limited", "lifted"):
        samples = scrape.parse(scrape.fetch(local[name].info["http"]))
        for role in ("decode", "prefill"):
            out[f"{name} {role}"] = scrape.value(samples, "tandem_workers", worker_role=role,
                                                 routable="false")
            assert scrape.value(samples, "tandem_workers", worker_role=role,
                                routable="true") == 1
    return out


def _served(router: Proc) -> None:
    status, body, _ = _chat(router, SCHEMA)
    assert status == 200, body
    jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), SCHEMA)


def test_the_router_refuses_the_heavy_schema_naming_the_limit(local) -> None:
    status, body, _ = _chat(local["limited"], HEAVY)
    assert status == 400, body
    message = body["error"]["message"]
    assert "2000 properties" in message and "--grammar-max-properties" in message
    assert set(_unroutable(local).values()) == {0}
    _served(local["limited"])


def test_past_the_compile_budget_is_a_400_and_no_worker_leaves_the_pool(local) -> None:
    status, body, seconds = _chat(local["lifted"], HEAVY)
    assert status == 400, body
    assert "compile budget" in body["error"]["message"]
    assert seconds < RPC_TIMEOUT_S  # answered before the router could call Reserve lost
    status, again, _ = _chat(local["lifted"], HEAVY)  # remembered: no second compile
    assert (status, again["error"]["message"]) == (400, body["error"]["message"])
    assert set(_unroutable(local).values()) == {0}
    _served(local["lifted"])
    _served(local["limited"])
    assert_idle(local["cluster"])
