"""Turning tracing on in a process: the flags, and the OpenTelemetry SDK behind them.

    --otlp-endpoint URL    export spans over OTLP (batched) to a collector; the standard
                           OTEL_EXPORTER_OTLP_ENDPOINT works too. The exporter package is
                           optional: pip install 'tandem-serve[otlp]'
    --otlp-protocol        grpc (default) | http
    --trace-file PATH      append each finished span as one JSON line (no collector needed;
                           several processes may share one file: one write per line)
    --trace-sample-ratio   share of new traces recorded (a worker follows the router's choice,
                           carried in ``traceparent``)

Neither an endpoint nor a file: nothing is installed and every span stays the API's no-op
(tandem/common/obs/tracing.py). The SDK is imported only when tracing is on.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExportResult

OTLP_PROTOCOLS = ("grpc", "http")
_EXPORTERS = {
    "grpc": ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
             "opentelemetry-exporter-otlp-proto-grpc"),
    "http": ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
             "opentelemetry-exporter-otlp-proto-http"),
}


class TracingSetupError(ValueError):
    """Tracing was asked for but cannot be set up (a missing exporter, a bad file or value)."""


@dataclass(frozen=True, slots=True)
class TracingConfig:
    """Where a process's spans go; ``enabled`` is False when nowhere."""

    otlp_endpoint: str = ""
    otlp_protocol: str = "grpc"
    trace_file: str = ""
    sample_ratio: float = 1.0

    def __post_init__(self) -> None:
        if self.otlp_protocol not in OTLP_PROTOCOLS:
            raise TracingSetupError(f"--otlp-protocol must be one of {', '.join(OTLP_PROTOCOLS)}")
        if not 0.0 <= self.sample_ratio <= 1.0:
            raise TracingSetupError("--trace-sample-ratio must be in 0..1")

    @property
    def enabled(self) -> bool:
        return bool(self.otlp_endpoint or self.trace_file)


def add_tracing_args(parser: argparse.ArgumentParser) -> None:
    """The tracing flags (every serving process takes them)."""
    g = parser.add_argument_group("tracing (OpenTelemetry; off unless one of these is given)")
    g.add_argument("--otlp-endpoint", default="", metavar="URL",
                   help="export spans over OTLP to this collector (default: "
                        "$OTEL_EXPORTER_OTLP_ENDPOINT; needs the otlp extra installed)")
    g.add_argument("--otlp-protocol", choices=OTLP_PROTOCOLS, default=None,
                   help="OTLP over grpc (default) or http")
    g.add_argument("--trace-file", default="", metavar="PATH",
                   help="append every finished span to PATH as one JSON line")
    g.add_argument("--trace-sample-ratio", type=float, default=1.0, metavar="R",
                   help="share of new traces recorded, 0..1 (default 1)")


def tracing_config_from_args(
    args: argparse.Namespace, env: Mapping[str, str] | None = None
) -> TracingConfig:
    """The flags (and the standard OTEL_EXPORTER_OTLP_* variables of ``env``, os.environ by
    default, where a flag is not given) as a TracingConfig; raises TracingSetupError."""
    env = os.environ if env is None else env
    protocol = args.otlp_protocol
    if protocol is None:
        protocol = "http" if env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").startswith("http") \
            else "grpc"
    return TracingConfig(
        otlp_endpoint=args.otlp_endpoint or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", ""),
        otlp_protocol=protocol, trace_file=args.trace_file,
        sample_ratio=args.trace_sample_ratio,
    )


def tracing_argv(args: argparse.Namespace) -> list[str]:
    """The tracing flags given to a launcher, as the argv of each process it starts."""
    out = []
    if getattr(args, "otlp_endpoint", ""):
        out.append(f"--otlp-endpoint={args.otlp_endpoint}")
    if getattr(args, "otlp_protocol", None):
        out.append(f"--otlp-protocol={args.otlp_protocol}")
    if getattr(args, "trace_file", ""):
        out.append(f"--trace-file={os.path.abspath(args.trace_file)}")
    if getattr(args, "trace_sample_ratio", 1.0) != 1.0:
        out.append(f"--trace-sample-ratio={args.trace_sample_ratio}")
    return out


def setup_tracing(config: TracingConfig, service: str,
                  env: Mapping[str, str] | None = None) -> TracerProvider | None:
    """Install the SDK as this process's tracer provider when ``config`` asks for tracing;
    returns it (None: tracing stays off). ``service`` is the resource's ``service.name``
    unless OTEL_SERVICE_NAME says otherwise. Raises TracingSetupError."""
    if not config.enabled:
        return None
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    env = os.environ if env is None else env
    attributes = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": service}
    provider = TracerProvider(resource=Resource.create(attributes),
                              sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)))
    if config.trace_file:
        # Written as each span ends: a file is cheap to append to, and readers (tests, a
        # user tailing it) see a span as soon as its work is done.
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(config.trace_file)))
    if config.otlp_endpoint:
        provider.add_span_processor(BatchSpanProcessor(
            otlp_exporter(config.otlp_endpoint, config.otlp_protocol)))
    trace.set_tracer_provider(provider)
    return provider


def otlp_exporter(endpoint: str, protocol: str) -> Any:
    """The OTLP span exporter of ``protocol`` for ``endpoint``; TracingSetupError naming the
    package to install when it is not."""
    module_name, package = _EXPORTERS[protocol]
    try:
        import importlib

        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TracingSetupError(
            f"--otlp-endpoint needs the OTLP exporter, which is not installed: "
            f"pip install {package} (or tandem-serve[otlp])") from exc
    if protocol == "http" and urlparse(endpoint).path in ("", "/"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"  # the collector's traces path
    return module.OTLPSpanExporter(endpoint=endpoint)


class JsonLinesSpanExporter:
    """Appends each span to a file (created 0600) as one JSON line (``span_record``); an
    OpenTelemetry ``SpanExporter``. Raises TracingSetupError when the file cannot be opened."""

    def __init__(self, path: str) -> None:
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as exc:
            raise TracingSetupError(f"cannot open --trace-file {path!r}: "
                                    f"{exc.strerror or exc}") from exc
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        from opentelemetry.sdk.trace.export import SpanExportResult

        data = "".join(json.dumps(span_record(s), default=str) + "\n" for s in spans).encode()
        with self._lock:
            if self._fd < 0:
                return SpanExportResult.FAILURE
            # One append per batch: the lines of processes sharing the file never interleave.
            os.write(self._fd, data)
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def shutdown(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def span_record(s: ReadableSpan) -> dict[str, Any]:
    """A finished span as a plain dict: ids in hex (as W3C writes them), times in epoch ns."""
    ctx = s.get_span_context()
    parent = s.parent
    return {
        "name": s.name,
        "service": s.resource.attributes.get("service.name", ""),
        "trace_id": format(ctx.trace_id, "032x") if ctx else "",
        "span_id": format(ctx.span_id, "016x") if ctx else "",
        "parent_span_id": format(parent.span_id, "016x") if parent else "",
        "remote_parent": bool(parent and parent.is_remote),
        "kind": s.kind.name,
        "start_ns": s.start_time,
        "end_ns": s.end_time,
        "status": s.status.status_code.name,
        "status_message": s.status.description or "",
        "attributes": dict(s.attributes or {}),
    }
