"""The router's spans for one request, and the W3C context every worker call carries (fake
workers record the ``traceparent`` they are sent)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tandem.protos.v1 import tandem_pb2
from tandem.router.tokenizer import RouterTokenizer
from tests.spans import by_name, spans  # noqa: F401  (the fixture)
from tests.unit.router.harness import MODEL, cluster

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


def _hex(value: int, width: int) -> str:
    return format(value, f"0{width}x")


def _parent_in(traceparent: str) -> tuple[str, str]:
    """(trace id, parent span id) of a traceparent header."""
    _, trace_id, span_id, _ = traceparent.split("-")
    return trace_id, span_id


def test_one_request_is_one_trace_down_to_every_worker_call(
        tokenizer: RouterTokenizer, spans: InMemorySpanExporter) -> None:  # noqa: F811
    async def scenario() -> Any:
        async with cluster(tokenizer, http_port=0, placement="remote") as c, \
                aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{c.router.http_port}/v1/completions"
            async with http.post(url, json={"model": MODEL, "prompt": "Hello", "max_tokens": 3},
                                 headers={"traceparent": TRACEPARENT}) as r:
                assert r.status == 200
            return c

    c = asyncio.run(scenario())
    found = by_name(spans)
    (request,) = found["request"]
    assert _hex(request.context.trace_id, 32) == CLIENT_TRACE  # the client's trace goes on
    assert _hex(request.parent.span_id, 16) == CLIENT_SPAN and request.kind is SpanKind.SERVER
    rid = request.attributes["tandem.request_id"]
    for name in ("admission", "tokenize", "placement", "DecodeService/Reserve",
                 "PrefillService/Prefill", "DecodeService/Decode"):
        (s,) = found[name]
        assert s.context.trace_id == request.context.trace_id, name
        assert s.parent.span_id == request.context.span_id, name
        assert s.status.status_code is StatusCode.UNSET, name
        assert s.start_time >= request.start_time and s.end_time <= request.end_time, name
    assert found["placement"][0].attributes["tandem.decision"] == "remote"
    assert request.attributes["tandem.completion_tokens"] == 3
    calls = {"Reserve": (found["DecodeService/Reserve"][0], c.decode[0]),
             "Decode": (found["DecodeService/Decode"][0], c.decode[0]),
             "Prefill": (found["PrefillService/Prefill"][0], c.prefill[0])}
    for method, (span, fake) in calls.items():
        assert span.kind is SpanKind.CLIENT and span.attributes["tandem.leg_id"] == rid
        # What the worker got names this call's span: its own span will be the child of it.
        assert _parent_in(fake.traceparents[method]) == (
            CLIENT_TRACE, _hex(span.context.span_id, 16)), method


def test_a_failed_prefill_and_its_fallback_are_in_the_trace(
        tokenizer: RouterTokenizer, spans: InMemorySpanExporter) -> None:  # noqa: F811
    async def scenario() -> None:
        async with cluster(tokenizer, placement="remote") as c:
            c.prefill[0].fail = True
            out = await c.generate(tandem_pb2.GenerateRequest(
                text="Hello", sampling=tandem_pb2.SamplingParams(max_tokens=2)))
            assert out[-1].finished

    asyncio.run(scenario())
    found = by_name(spans)
    (request,) = found["request"]
    assert request.parent is None  # no traceparent came: the router starts the trace
    (prefill,) = found["PrefillService/Prefill"]
    assert prefill.status.status_code is StatusCode.ERROR
    assert "UNAVAILABLE" in prefill.status.description
    (local,) = found["DecodeService/PrefillLocal"]
    assert local.status.status_code is StatusCode.UNSET
    aborts = found["PrefillService/Abort"] + found["DecodeService/Abort"]
    assert aborts and all(s.parent.span_id == request.context.span_id for s in aborts)
    assert len(found["DecodeService/Reserve"]) == 2  # the fallback's fresh reservation
    assert {s.context.trace_id for v in found.values() for s in v} == {
        request.context.trace_id}


def test_grpc_traceparent_metadata_continues_the_clients_trace(
        tokenizer: RouterTokenizer, spans: InMemorySpanExporter) -> None:  # noqa: F811
    async def scenario() -> None:
        async with cluster(tokenizer, placement="remote") as c:
            await c.generate(tandem_pb2.GenerateRequest(
                text="Hello", sampling=tandem_pb2.SamplingParams(max_tokens=2)),
                metadata=(("traceparent", TRACEPARENT),))

    asyncio.run(scenario())
    (request,) = by_name(spans)["request"]
    assert _hex(request.context.trace_id, 32) == CLIENT_TRACE
    assert _hex(request.parent.span_id, 16) == CLIENT_SPAN
