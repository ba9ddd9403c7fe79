"""Which request a log line belongs to: a context variable bound per request, and a logging
filter that stamps it on every record.

    router edge (Frontend.generate): bind(request_id=<minted>, label=<the client's id or the
                                          minted one>, trace ids of the request's span)
    worker RPC (servicers):          bind(request_id=<the leg id the router sent>, trace ids)
    any logger, in that task or a task it started ──RequestContextFilter──> record.request_id,
        record.client_request_id, record.trace_id, record.span_id ("" outside a request)

The value lives in a ``contextvars.ContextVar``: asyncio tasks started inside a request
inherit it, concurrent requests never see each other's, and a thread of its own (the engine's)
starts without one, so its lines carry no request id rather than a wrong one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass

# Record attributes the filter sets (the formatters read them).
FIELDS = ("request_id", "client_request_id", "trace_id", "span_id")


@dataclass(frozen=True, slots=True)
class LogContext:
    """One request's ids as its log lines show them ("" where there is none)."""

    request_id: str
    label: str = ""  # the client's id for the request (router only; never sent to workers)
    trace_id: str = ""  # 32 hex digits when the request is traced
    span_id: str = ""  # 16 hex digits: the span the request's lines belong to


_CURRENT: ContextVar[LogContext | None] = ContextVar("tandem_log_context", default=None)


def current() -> LogContext | None:
    """The request this code runs for, if any."""
    return _CURRENT.get()


@contextmanager
def bound(
    request_id: str, label: str = "", trace_ids: tuple[str, str] | None = None
) -> Iterator[LogContext]:
    """Every log line emitted inside the block (and in tasks it starts) names this request;
    ``trace_ids`` is ``(trace_id, span_id)`` of its span (tandem/common/obs/tracing.py ``ids``)."""
    token = bind(request_id, label, trace_ids)
    try:
        yield _CURRENT.get()  # type: ignore[misc]
    finally:
        unbind(token)


def bind(request_id: str, label: str = "", trace_ids: tuple[str, str] | None = None
         ) -> Token[LogContext | None]:
    """``bound`` without the block: the caller hands the token to ``unbind`` when done."""
    trace_id, span_id = trace_ids or ("", "")
    return _CURRENT.set(LogContext(request_id, label, trace_id, span_id))


def unbind(token: Token[LogContext | None]) -> None:
    """Undo the ``bind`` that returned ``token``."""
    try:
        _CURRENT.reset(token)
    except ValueError:
        # Left in another context than it was entered in: an async generator finalized by
        # the event loop's hook (a task of its own). The context it was bound in is gone
        # with its task, so there is nothing to undo.
        pass


class RequestContextFilter(logging.Filter):
    """Sets ``FIELDS`` on every record from the current request ("" outside one); attach it to
    a handler so records from every logger, ours or a library's, get them."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = _CURRENT.get()
        if ctx is None:
            record.request_id = record.client_request_id = record.trace_id = record.span_id = ""
        else:
            record.request_id = ctx.request_id
            record.client_request_id = ctx.label if ctx.label != ctx.request_id else ""
            record.trace_id = ctx.trace_id
            record.span_id = ctx.span_id
        return True
