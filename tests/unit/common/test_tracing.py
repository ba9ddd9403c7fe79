"""Spans, W3C propagation through plain dicts, the trace file, and tracing's flags."""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from tandem.common.obs import tracing
from tandem.common.obs.tracing_setup import (
    JsonLinesSpanExporter,
    TracingConfig,
    TracingSetupError,
    add_tracing_args,
    otlp_exporter,
    setup_tracing,
    tracing_argv,
    tracing_config_from_args,
)
from tests.spans import by_name, spans  # noqa: F401  (the fixture)

ROOT = Path(__file__).resolve().parents[3]
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


def test_off_by_default_costs_no_sdk_and_sends_nothing_of_its_own() -> None:
    """In a process that installed nothing: no-op spans, no SDK imported, no metadata but a
    client's own trace context passed through unchanged (W3C pass-through)."""
    code = (
        "import sys\n"
        "from tandem.common.obs import tracing\n"
        "tp = sys.argv[1]\n"
        "s = tracing.start_span('x')\n"
        "assert not s.is_recording() and tracing.metadata(s) == () and tracing.ids(s) is None\n"
        "c = tracing.start_span('y', tracing.extract({'traceparent': tp}))\n"
        "assert not c.is_recording() and tracing.metadata(c) == (('traceparent', tp),)\n"
        "s.end(); c.end()\n"
        "assert not any(m.startswith('opentelemetry.sdk') for m in sys.modules)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code, TRACEPARENT], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def test_extract_takes_a_valid_traceparent_only() -> None:
    ctx = tracing.extract({"traceparent": TRACEPARENT, "other": "x"})
    assert ctx is not None
    for bad in ({}, {"traceparent": "garbage"}, {"traceparent": "00-" + "0" * 32 + "-" +
                 CLIENT_SPAN + "-01"}, {"traceparent": TRACEPARENT + "x" * 2000},
                {"tracestate": "a=b"}):
        assert tracing.extract(bad) is None, bad


def test_a_child_across_a_carrier_keeps_the_trace_and_names_its_parent(
        spans: InMemorySpanExporter) -> None:  # noqa: F811
    with tracing.span("request", tracing.extract({"traceparent": TRACEPARENT}),
                      kind=tracing.SERVER) as root:
        with tracing.span("call", root, kind=tracing.CLIENT) as call:
            metadata = dict(tracing.metadata(call))
        assert set(metadata) == {"traceparent"}
        with tracing.span("remote", tracing.extract(metadata), kind=tracing.SERVER):
            pass
    found = by_name(spans)
    (request,), (call_span,), (remote,) = found["request"], found["call"], found["remote"]
    assert {format(s.context.trace_id, "032x") for s in (request, call_span, remote)} == {
        CLIENT_TRACE}
    assert format(request.parent.span_id, "016x") == CLIENT_SPAN and request.parent.is_remote
    assert call_span.parent.span_id == request.context.span_id
    assert remote.parent.span_id == call_span.context.span_id and remote.parent.is_remote
    assert tracing.ids(root) == (CLIENT_TRACE, format(request.context.span_id, "016x"))


def test_a_root_never_adopts_a_current_span(spans: InMemorySpanExporter) -> None:  # noqa: F811
    from opentelemetry import trace

    outer = tracing.start_span("outer")
    with trace.use_span(outer, end_on_exit=True):
        tracing.start_span("root").end()
        tracing.start_span("also root", tracing.NO_SPAN).end()
    found = by_name(spans)
    assert found["root"][0].parent is None and found["also root"][0].parent is None
    assert found["root"][0].context.trace_id != outer.get_span_context().trace_id


def test_failures_cancellations_and_early_ends(spans: InMemorySpanExporter) -> None:  # noqa: F811
    with pytest.raises(ValueError), tracing.span("failed"):
        raise ValueError("bad leg")
    with pytest.raises(asyncio.CancelledError), tracing.span("cancelled"):
        raise asyncio.CancelledError

    def stream():  # a consumer that stops early closes it: GeneratorExit, not a failure
        with tracing.span("closed"):
            yield 1
            yield 2

    gen = stream()
    next(gen)
    gen.close()
    with tracing.span("ended early") as s:
        s.end()  # a stream's last message is out; the block ends later
    found = by_name(spans)
    failed = found["failed"][0]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "ValueError: bad leg"
    assert [e.name for e in failed.events] == ["exception"]
    assert found["cancelled"][0].status.description == "cancelled"
    assert not found["cancelled"][0].events
    assert found["closed"][0].status.status_code is StatusCode.UNSET
    assert len(found["ended early"]) == 1


def test_trace_file_lines(tmp_path: Path, spans: InMemorySpanExporter) -> None:  # noqa: F811
    with tracing.span("request", tracing.extract({"traceparent": TRACEPARENT}),
                      attributes={"tandem.request_id": "r1"}) as root:
        tracing.start_span("child", root).end()
    path = tmp_path / "spans.jsonl"
    exporter = JsonLinesSpanExporter(str(path))
    exporter.export(spans.get_finished_spans())
    exporter.export(spans.get_finished_spans()[:1])
    exporter.shutdown()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["name"] for r in lines] == ["child", "request", "child"]
    child, request = lines[0], lines[1]
    assert request["trace_id"] == child["trace_id"] == CLIENT_TRACE
    assert request["parent_span_id"] == CLIENT_SPAN and request["remote_parent"]
    assert child["parent_span_id"] == request["span_id"] and not child["remote_parent"]
    assert request["attributes"] == {"tandem.request_id": "r1"}
    assert request["kind"] == "INTERNAL" and request["status"] == "UNSET"
    assert request["end_ns"] >= request["start_ns"] > 0
    assert path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(TracingSetupError, match="cannot open --trace-file"):
        JsonLinesSpanExporter(str(tmp_path / "missing" / "spans.jsonl"))


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_tracing_args(p)
    return p.parse_args(list(argv))


def test_config_from_flags_and_the_standard_environment() -> None:
    assert not tracing_config_from_args(_args(), env={}).enabled
    assert setup_tracing(tracing_config_from_args(_args(), env={}), "x") is None
    from_env = tracing_config_from_args(_args(), env={
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
    assert from_env == TracingConfig("http://collector:4318", "http")
    flags = _args("--otlp-endpoint", "http://c:4317", "--otlp-protocol", "grpc",
                  "--trace-file", "t.jsonl", "--trace-sample-ratio", "0.5")
    config = tracing_config_from_args(flags, env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"})
    assert config == TracingConfig("http://c:4317", "grpc", "t.jsonl", 0.5) and config.enabled
    assert tracing_argv(_args()) == []
    argv = tracing_argv(flags)
    assert argv[:2] == ["--otlp-endpoint=http://c:4317", "--otlp-protocol=grpc"]
    assert argv[2] == f"--trace-file={Path('t.jsonl').resolve()}"
    assert argv[3] == "--trace-sample-ratio=0.5"
    with pytest.raises(TracingSetupError, match="0..1"):
        tracing_config_from_args(_args("--trace-sample-ratio", "2"), env={})


def test_a_missing_otlp_exporter_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
                   "opentelemetry.exporter.otlp.proto.http.trace_exporter"):
        monkeypatch.setitem(sys.modules, module, None)  # import of it fails, installed or not
    with pytest.raises(TracingSetupError, match="pip install opentelemetry-exporter-otlp-proto-grpc"):
        otlp_exporter("http://collector:4317", "grpc")
    with pytest.raises(TracingSetupError, match="opentelemetry-exporter-otlp-proto-http"):
        otlp_exporter("http://collector:4318", "http")
