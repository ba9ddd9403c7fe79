"""The READY line both ends spell through ``tandem.common.wire``."""

from __future__ import annotations

from tandem.common.wire import READY_MARKER, parse_ready_line, ready_line


def test_ready_line_round_trips() -> None:
    info = {"role": "decode", "grpc": "127.0.0.1:5", "kv": "127.0.0.1:6"}
    line = ready_line(info)
    assert line.startswith(READY_MARKER + " ") and line.endswith("\n") and line.count("\n") == 1
    assert parse_ready_line(line) == info
    assert parse_ready_line(line.rstrip("\n")) == info


def test_other_lines_are_not_ready_lines() -> None:
    for line in ("", "hello", READY_MARKER, READY_MARKER + "{}", READY_MARKER + " not json",
                 READY_MARKER + ' ["a list"]', "x " + ready_line({"role": "up"})):
        assert parse_ready_line(line) is None, line
