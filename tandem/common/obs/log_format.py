"""How every Tandem process writes its log: ``--log-format text|json`` and ``--log-level``.

    text   2026-01-02 03:04:05,678 INFO tandem.router.handoff.ledger: worker ... left the pool
               [request_id=9f2c... trace_id=4bf9...]          (the bracket only in a request)
    json   {"timestamp": "2026-01-02T03:04:05.678Z", "level": "INFO", "logger": "...",
            "message": "...", "service": "router", "request_id": "9f2c...",
            "client_request_id": "...", "trace_id": "...", "span_id": "..."}
           one object per line; the request and trace keys only where they have a value,
           "exception" (the formatted traceback) when the record carries one

Both read the request a line belongs to from tandem/common/obs/log_context.py (its filter sits on the
handler ``setup_logging`` installs). Logs go to stderr: stdout carries the READY line.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any, TextIO

from tandem.common.obs.log_context import FIELDS, RequestContextFilter

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class TextFormatter(logging.Formatter):
    """The classic one-line format, with the request's ids in a bracket at the end."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = " ".join(f"{name}={value}" for name in FIELDS
                       if name != "span_id" and (value := getattr(record, name, "")))
        if not ids:
            return line
        head, newline, rest = line.partition("\n")  # a traceback stays below the bracket
        return f"{head} [{ids}]{newline}{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line (see the module docstring); ``service`` names the process."""

    def __init__(self, service: str = "") -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "timestamp": _iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self._service:
            out["service"] = self._service
        for name in FIELDS:
            value = getattr(record, name, "")
            if value:
                out[name] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str)


def _iso(created: float) -> str:
    """``created`` (epoch seconds) as ISO 8601 UTC with milliseconds: 2026-01-02T03:04:05.678Z"""
    stamp = datetime.fromtimestamp(created, tz=timezone.utc).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


class _TandemHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler ``setup_logging`` installs (so a second call replaces it, not adds one)."""


class _StderrHandler(_TandemHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (as logging's last resort
    does), not the stream it was when the handler was made."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


def formatter(log_format: str, service: str = "") -> logging.Formatter:
    """The formatter of ``log_format`` ("text" | "json"); ValueError for anything else."""
    if log_format == "text":
        return TextFormatter()
    if log_format == "json":
        return JsonFormatter(service)
    raise ValueError(f"unknown log format {log_format!r} (one of {', '.join(LOG_FORMATS)})")


def setup_logging(
    log_format: str = "text", level: str | int = "INFO", service: str = "",
    stream: TextIO | None = None,
) -> logging.Handler:
    """Log every record at ``level`` or above to ``stream`` (stderr) in ``log_format``, with
    the request's ids; replaces the handler an earlier call installed, leaves others alone.
    Returns the handler."""
    handler = _TandemHandler(stream) if stream is not None else _StderrHandler()
    handler.setFormatter(formatter(log_format, service))
    handler.addFilter(RequestContextFilter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _TandemHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler


def add_log_args(parser: argparse.ArgumentParser) -> None:
    """``--log-format`` and ``--log-level`` (every serving process takes them)."""
    g = parser.add_argument_group("logging")
    g.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                   help="text: one line per record; json: one JSON object per line with "
                        "timestamp, level, logger, message, request_id and trace ids")
    g.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default="INFO",
                   help="lowest level logged (default INFO)")


def log_argv(args: argparse.Namespace) -> list[str]:
    """The logging flags given to a launcher, as the argv of each process it starts
    (a flag left at its default is not passed)."""
    out = []
    if getattr(args, "log_format", "text") != "text":
        out.append(f"--log-format={args.log_format}")
    if getattr(args, "log_level", "INFO") != "INFO":
        out.append(f"--log-level={args.log_level}")
    return out
