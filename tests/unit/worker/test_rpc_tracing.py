"""The workers' side of a trace: each RPC a span under the caller's ``traceparent``, the
prefill's tandem/engine/push/commit spans under its call, and the leg id on the call's log lines."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tandem.common.obs import log_context, tracing
from tandem.protos.v1 import worker_pb2
from tandem.worker.rpc_context import serving
from tests.spans import by_name, spans  # noqa: F401  (the fixture)
from tests.unit.worker.harness import cluster, greedy

PROMPT = list(range(20, 60))
TRACE = "5b8efff798038103d269b633813fc60c"
CALLER = {"Reserve": "1111111111111111", "Prefill": "2222222222222222",
          "Decode": "3333333333333333"}


def _md(method: str) -> tuple[tuple[str, str], ...]:
    return (("traceparent", f"00-{TRACE}-{CALLER[method]}-01"),)


@pytest.fixture
def engines(tiny_dir, make_engine):
    path = str(tiny_dir("llama", 2))
    return (make_engine(model=path, num_blocks=32, block_size=16),
            make_engine(model=path, num_blocks=32, block_size=16))


def test_serving_binds_the_leg_and_continues_the_callers_trace(
        spans: InMemorySpanExporter) -> None:  # noqa: F811
    context = SimpleNamespace(invocation_metadata=lambda: (*_md("Reserve"), ("x-bin", b"\0")))
    assert log_context.current() is None
    with serving(context, "DecodeService/Reserve", "rid.1") as span:  # type: ignore[arg-type]
        bound = log_context.current()
        assert bound is not None and bound.request_id == "rid.1"
        assert (bound.trace_id, bound.span_id) == tracing.ids(span)
    assert log_context.current() is None
    (s,) = spans.get_finished_spans()
    assert s.kind is SpanKind.SERVER and format(s.parent.span_id, "016x") == CALLER["Reserve"]
    assert format(s.context.trace_id, "032x") == TRACE
    assert s.attributes["rpc.method"] == "Reserve" and s.attributes["tandem.leg_id"] == "rid.1"


def test_a_handoff_on_real_workers_is_traced_under_its_callers(
        engines, spans: InMemorySpanExporter) -> None:  # noqa: F811
    async def main() -> None:
        async with cluster(*engines) as c:
            res = await c.decode_stub.Reserve(worker_pb2.ReserveRequest(
                request_id="r", token_ids=PROMPT, sampling=greedy(4), lease_s=10),
                metadata=_md("Reserve"))
            await c.prefill_stub.Prefill(worker_pb2.PrefillRequest(
                request_id="r", token_ids=PROMPT, sampling=greedy(4),
                transfer_id=res.transfer_id, block_ids=res.block_ids,
                kv_endpoint=res.kv_endpoint, layout=res.layout), metadata=_md("Prefill"))
            msgs = [m async for m in c.decode_stub.Decode(
                worker_pb2.DecodeRequest(request_id="r"), metadata=_md("Decode"))]
            assert msgs[-1].finished
            await c.settle()

    asyncio.run(main())
    found = by_name(spans)
    calls = {}
    for method, service in (("Reserve", "DecodeService"), ("Prefill", "PrefillService"),
                            ("Decode", "DecodeService")):
        (s,) = found[f"{service}/{method}"]
        assert s.kind is SpanKind.SERVER and s.status.status_code is StatusCode.UNSET
        assert format(s.context.trace_id, "032x") == TRACE
        assert format(s.parent.span_id, "016x") == CALLER[method], method
        calls[method] = s
    assert calls["Reserve"].attributes["tandem.blocks"] == len(PROMPT) // 16 + 1
    prefill = calls["Prefill"]
    (engine,), (push,), (commit,) = found["prefill.engine"], found["kv.push"], found["kv.commit"]
    assert engine.parent.span_id == push.parent.span_id == prefill.context.span_id
    assert commit.parent.span_id == push.context.span_id
    assert engine.end_time <= commit.start_time <= commit.end_time <= push.end_time
    assert push.attributes["tandem.layers_pushed"] > 0 and push.attributes["tandem.bytes"] > 0
    assert engine.attributes["tandem.prompt_tokens"] == len(PROMPT)


def test_a_push_that_fails_marks_its_span(engines, spans: InMemorySpanExporter) -> None:  # noqa: F811
    async def main() -> None:
        async with cluster(*engines, connect_timeout_s=1.0) as c:
            res = await c.reserve("r", PROMPT, greedy(4))
            with pytest.raises(Exception):  # noqa: B017, PT011 - the status is not the point
                await c.prefill_stub.Prefill(worker_pb2.PrefillRequest(
                    request_id="r", token_ids=PROMPT, sampling=greedy(4),
                    transfer_id="not-" + res.transfer_id, block_ids=res.block_ids,
                    kv_endpoint=res.kv_endpoint, layout=res.layout), metadata=_md("Prefill"))
            assert (await c.decode_stub.Abort(worker_pb2.AbortRequest(request_id="r"))).found
            await c.settle()

    asyncio.run(main())
    found = by_name(spans)
    (push,) = found["kv.push"]
    (call,) = found["PrefillService/Prefill"]
    assert push.status.status_code is StatusCode.ERROR
    assert call.status.status_code is StatusCode.ERROR
