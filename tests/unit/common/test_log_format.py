"""Request-scoped log context and the text/JSON formats every process logs in."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tandem.common.obs import log_context
from tandem.common.obs.log_format import add_log_args, log_argv, setup_logging


@contextmanager
def restored_root() -> Iterator[logging.Logger]:
    """The root logger, its level and handlers put back as they were afterwards (an earlier
    test may have left a handler of setup_logging's, which a new call replaces)."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        yield root
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.fixture
def capture() -> Iterator[tuple[io.StringIO, logging.Handler]]:
    """Root logs in JSON into a buffer for the test (the handler setup_logging installs)."""
    with restored_root():
        out = io.StringIO()
        yield out, setup_logging("json", "DEBUG", service="router", stream=out)


def _lines(out: io.StringIO) -> list[dict[str, object]]:
    text = out.getvalue()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]  # every line one JSON object


def test_json_lines_carry_the_request_from_any_module_only_inside_it(capture) -> None:
    out, _ = capture
    logging.getLogger("tandem.router.handoff.ledger").info("before")
    with log_context.bound("abc123", "client-7", ("0" * 31 + "1", "0" * 15 + "2")):
        logging.getLogger("tandem.router.frontend").warning("inside %s", "x")
        logging.getLogger("grpc._cython").debug("a library's line")  # not one of ours
    logging.getLogger("router").error("after")
    before, inside, library, after = _lines(out)
    for line in (before, after):
        assert {"request_id", "client_request_id", "trace_id", "span_id"}.isdisjoint(line)
    for line in (inside, library):
        assert line["request_id"] == "abc123" and line["client_request_id"] == "client-7"
        assert line["trace_id"] == "0" * 31 + "1" and line["span_id"] == "0" * 15 + "2"
    assert inside == {**inside, "level": "WARNING", "logger": "tandem.router.frontend",
                      "message": "inside x", "service": "router"}
    assert inside["timestamp"].endswith("Z") and "T" in inside["timestamp"]


def test_the_minted_id_is_not_repeated_as_the_client_id(capture) -> None:
    out, _ = capture
    with log_context.bound("abc", "abc"):  # no client id: the label is the minted id
        logging.getLogger("x").info("m")
    (line,) = _lines(out)
    assert line["request_id"] == "abc" and "client_request_id" not in line


def test_json_stays_one_line_with_hostile_text_and_tracebacks(capture) -> None:
    out, _ = capture
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        logging.getLogger("x").exception("ctl \x00\x1b[31m\r\n\"quoted\" ü")
    (line,) = _lines(out)
    assert line["message"] == "ctl \x00\x1b[31m\r\n\"quoted\" ü"
    assert "ValueError: boom" in str(line["exception"])


def test_text_format_puts_the_ids_in_a_bracket_and_the_traceback_below() -> None:
    out = io.StringIO()
    with restored_root():
        setup_logging("text", "INFO", stream=out)
        logging.getLogger("a").info("plain")
        with log_context.bound("rid1", "mine"):
            try:
                raise KeyError("k")
            except KeyError:
                logging.getLogger("b").exception("failed")
        logging.getLogger("c").debug("below the level")
    lines = out.getvalue().splitlines()
    assert lines[0].endswith(" INFO a: plain")
    assert lines[1].endswith(" ERROR b: failed [request_id=rid1 client_request_id=mine]")
    assert lines[2] == "Traceback (most recent call last):"
    assert not any("below the level" in line for line in lines)


def test_concurrent_requests_never_see_each_others_ids(capture) -> None:
    out, _ = capture
    log = logging.getLogger("tandem.router.frontend")

    async def request(rid: str, turn: asyncio.Event, next_turn: asyncio.Event) -> None:
        with log_context.bound(rid):
            log.info("start %s", rid)
            child = asyncio.ensure_future(_child(rid))  # a task it starts inherits the id
            next_turn.set()
            await turn.wait()  # the other request runs meanwhile
            log.info("end %s", rid)
            await child

    async def _child(rid: str) -> None:
        log.info("child of %s", rid)

    async def main() -> None:
        a, b = asyncio.Event(), asyncio.Event()
        await asyncio.gather(request("r-a", a, b), request("r-b", b, a))

    asyncio.run(main())
    seen = [(line["message"], line.get("request_id")) for line in _lines(out)
            if line["logger"] == "tandem.router.frontend"]
    assert len(seen) == 6 and all(str(msg).endswith(str(rid)) for msg, rid in seen), seen


def test_a_thread_of_its_own_logs_without_the_request(capture) -> None:
    out, _ = capture
    with log_context.bound("rid"):
        t = threading.Thread(target=lambda: logging.getLogger("engine").info("step"))
        t.start()
        t.join()
    (line,) = _lines(out)
    assert "request_id" not in line


def test_setup_replaces_its_own_handler_only() -> None:
    with restored_root() as root:
        others = list(root.handlers)
        first = setup_logging("text", "INFO", stream=io.StringIO())
        second = setup_logging("json", "WARNING", stream=io.StringIO())
        assert first not in root.handlers and second in root.handlers
        assert root.level == logging.WARNING
        assert [h for h in root.handlers if h is not second] == [
            h for h in others if not isinstance(h, type(second))]


def test_flags_and_what_launchers_forward() -> None:
    p = argparse.ArgumentParser()
    add_log_args(p)
    assert log_argv(p.parse_args([])) == []
    args = p.parse_args(["--log-format", "json", "--log-level", "debug"])
    assert (args.log_format, args.log_level) == ("json", "DEBUG")
    assert log_argv(args) == ["--log-format=json", "--log-level=DEBUG"]
    with pytest.raises(SystemExit):
        p.parse_args(["--log-format", "xml"])
