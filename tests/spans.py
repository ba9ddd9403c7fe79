"""Finished spans of this test process, for tests that check what is traced.

OpenTelemetry lets a process install its tracer provider once, so the first test that asks
for ``spans`` installs an SDK provider for the rest of the session; its processor hands
finished spans to an in-memory exporter only while a test holds the fixture (other tests'
spans are recorded, then dropped). Use it as a fixture:

    from tests.spans import spans  # noqa: F401  (the fixture)

    def test_x(spans: InMemorySpanExporter) -> None: ... spans.get_finished_spans() ...
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class _Switch(SpanProcessor):
    """Exports to ``exporter`` while one is set."""

    def __init__(self) -> None:
        self.exporter: InMemorySpanExporter | None = None

    def on_end(self, span: ReadableSpan) -> None:
        if self.exporter is not None:
            self.exporter.export((span,))


_SWITCH = _Switch()


def _install() -> None:
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        if _SWITCH not in provider._active_span_processor._span_processors:
            raise RuntimeError("another SDK tracer provider is installed in this process")
        return
    provider = TracerProvider()
    provider.add_span_processor(_SWITCH)
    trace.set_tracer_provider(provider)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans that end while the test runs."""
    _install()
    exporter = InMemorySpanExporter()
    _SWITCH.exporter = exporter
    try:
        yield exporter
    finally:
        _SWITCH.exporter = None


def by_name(exporter: InMemorySpanExporter) -> dict[str, list[Any]]:
    """The finished spans grouped by name, in the order they ended."""
    out: dict[str, list[Any]] = {}
    for s in exporter.get_finished_spans():
        out.setdefault(s.name, []).append(s)
    return out
