"""Spans and W3C trace context, the same way in every process (OpenTelemetry API only).

One disaggregated request is one trace::

    router   request ─┬─ admission
                      ├─ placement
                      ├─ DecodeService/Reserve (client) ──traceparent──> decode: DecodeService/Reserve
                      ├─ PrefillService/Prefill (client) ─traceparent──> prefill: PrefillService/Prefill
                      │                                                    ├─ prefill.engine
                      │                                                    └─ kv.push ── kv.commit
                      └─ DecodeService/Decode (client) ──traceparent──> decode: DecodeService/Decode

Spans are passed explicitly (``parent=``), never made "current": a span outlives many awaits
and yields of an async generator, and an explicit parent cannot leak into another request's
task. The context crosses processes as the W3C ``traceparent`` (and ``tracestate``) header /
gRPC metadata key; ``extract`` and ``metadata`` take and give plain dicts and tuples.

Off by default: until tandem/common/obs/tracing_setup.py installs an SDK provider (``--otlp-endpoint``,
``--trace-file``), every span is the API's no-op (about a microsecond to start and end; spans
are per request phase, never per token) and nothing is recorded. A no-op span carries its
parent's context, so a client's own ``traceparent`` still passes through to the workers
unchanged (W3C pass-through; its trace id then names the request's log lines too); without
one, ``metadata`` is empty.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import TracebackType

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_KEYS = (TRACEPARENT, TRACESTATE)
_MAX_HEADER_CHARS = 1024  # W3C: traceparent is 55 characters, tracestate at most 512
_W3C = TraceContextTextMapPropagator()
_TRACER = trace.get_tracer("tandem")  # a proxy: real once a provider is installed

CLIENT, SERVER, INTERNAL = SpanKind.CLIENT, SpanKind.SERVER, SpanKind.INTERNAL
NO_SPAN: Span = trace.INVALID_SPAN  # a parent that is no span: its children start new traces
Parent = Span | Context | None
Attributes = Mapping[str, str | int | float | bool]


def start_span(name: str, parent: Parent = None, *, kind: SpanKind = INTERNAL,
               attributes: Attributes | None = None, start_ns: int | None = None) -> Span:
    """A started span, child of ``parent`` (a span, an extracted context, or None for a new
    trace); the caller ends it (or use ``span``). ``start_ns``: epoch nanoseconds."""
    if isinstance(parent, Context):
        context = parent
    elif parent is not None and parent.get_span_context().is_valid:
        context = trace.set_span_in_context(parent, Context())
    else:
        context = Context()  # a root: never whatever happens to be current
    return _TRACER.start_span(name, context, kind, attributes, start_time=start_ns)


def span(name: str, parent: Parent = None, *, kind: SpanKind = INTERNAL,
         attributes: Attributes | None = None, start_ns: int | None = None) -> Ended:
    """``start_span`` for a ``with`` block, ended on leaving it (``ended``)."""
    return Ended(start_span(name, parent, kind=kind, attributes=attributes, start_ns=start_ns))


def ended(s: Span) -> Ended:
    """``s`` for a ``with`` block, ended on leaving it (``Ended``)."""
    return Ended(s)


class Ended:
    """Ends its span on leaving the ``with`` block unless the block ended it already (a
    stream whose last message is out: what happens to the call after that is not its work);
    an exception marks it failed (``fail``), a closed generator (GeneratorExit: its consumer
    stopped early) does not. A class, not a generator: a few of these run per request."""

    __slots__ = ("span",)

    def __init__(self, s: Span) -> None:
        self.span = s

    def __enter__(self) -> Span:
        return self.span

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        s = self.span
        if exc is not None and not isinstance(exc, GeneratorExit):
            fail(s, exc)
        if s.is_recording():
            s.end()


def fail(s: Span, exc: BaseException) -> None:
    """Mark ``s`` failed by ``exc`` (a cancellation is said in the status, without a trace);
    nothing once ``s`` has ended."""
    if not s.is_recording():
        return
    if isinstance(exc, asyncio.CancelledError):
        s.set_status(Status(StatusCode.ERROR, "cancelled"))
        return
    s.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:512]))
    s.record_exception(exc)


def extract(carrier: Mapping[str, str]) -> Context | None:
    """The remote parent in ``carrier`` (HTTP headers or a dict of gRPC metadata), or None
    when it holds no valid ``traceparent``. Bounded: an oversized value is ignored."""
    found: dict[str, str] = {}
    for key in _KEYS:
        value = carrier.get(key)
        if isinstance(value, str) and len(value) <= _MAX_HEADER_CHARS:
            found[key] = value
    if TRACEPARENT not in found:
        return None
    context = _W3C.extract(found)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def carrier(s: Span) -> dict[str, str]:
    """``s``'s context as W3C headers ({} when ``s`` is a no-op span: nothing to continue)."""
    out: dict[str, str] = {}
    if s.get_span_context().is_valid:
        _W3C.inject(out, trace.set_span_in_context(s, Context()))
    return out


def metadata(s: Span) -> tuple[tuple[str, str], ...]:
    """``carrier(s)`` as gRPC call metadata."""
    return tuple(carrier(s).items())


def ids(s: Span) -> tuple[str, str] | None:
    """``(trace_id, span_id)`` of ``s`` in hex, for log lines; None for a no-op span."""
    ctx = s.get_span_context()
    if not ctx.is_valid:
        return None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")
