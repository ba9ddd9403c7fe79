"""The grammar compile budget (tandem/engine/structured/compile_pool.py, grammar_engine.py): a
real compile past its CPU budget is refused and the refusal remembered (a repeat is refused
without compiling again), the pool moves on to the next grammar while the runaway finishes on
its own thread, a compile not ready within the wait is "busy" (not refused, compiled once), and
the pool's bounds (queue, runaway threads) hold."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest

from tandem.engine.errors import GrammarBusyError, InvalidRequestError
from tandem.engine.structured.compile_pool import CompileOverBudget, CompilePool, CompilerBusy
from tandem.engine.structured.grammar_engine import GrammarEngine
from tandem.engine.structured.spec import StructuredOutput

# ~2 s of CPU with SmolLM2's 49k vocabulary (optional properties cost about quadratically)
HEAVY = StructuredOutput("json_schema", json.dumps(
    {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(1000)}}))
LIGHT = StructuredOutput("json_schema", json.dumps(
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}))


@pytest.fixture(scope="module")
def tokenizer(tiny_vocab_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_vocab_dir))


def _engine(tokenizer: Any, budget_s: float, wait_s: float) -> GrammarEngine:
    return GrammarEngine(tokenizer, 49152, frozenset({2}), budget_s=budget_s, wait_s=wait_s)


def test_a_compile_past_its_budget_is_refused_once_and_remembered(tokenizer) -> None:
    # a long wait: the refusal must come from the CPU budget, not from the wait running out
    grammars = _engine(tokenizer, budget_s=0.05, wait_s=600)

    async def scenario() -> None:
        with pytest.raises(InvalidRequestError, match="0.05 s compile budget") as err:
            await grammars.prepare(HEAVY)
        assert err.value.field == "structured_outputs.json_schema"
        assert (grammars.pool.started, grammars.pool.over_budget) == (1, 1)
        for _ in range(2):  # a repeat is refused at once, from the cache
            with pytest.raises(InvalidRequestError, match="compile budget"):
                await grammars.prepare(HEAVY)
        with pytest.raises(InvalidRequestError, match="compile budget"):
            grammars.compile(HEAVY)  # the engine thread's path: no inline compile either
        assert grammars.pool.started == 1
        # the next grammar compiles on a fresh thread while the runaway one finishes
        await grammars.prepare(LIGHT)
        assert grammars.pool.started == 2
        grammars.constraint(LIGHT)  # a lookup now
        assert grammars.pool.started == 2

    try:
        asyncio.run(scenario())
    finally:
        grammars.close()
    assert grammars.cache_bytes > 0


def test_a_compile_not_ready_in_time_is_busy_and_compiled_once(tokenizer) -> None:
    grammars = _engine(tokenizer, budget_s=600, wait_s=0.001)

    async def scenario() -> None:
        with pytest.raises(GrammarBusyError, match="not compiled within"):
            await grammars.prepare(HEAVY)
        grammars.wait_s = 600  # the next caller waits for the same compile, not a new one
        await grammars.prepare(HEAVY)
        assert (grammars.pool.started, grammars.pool.over_budget) == (1, 0)
        grammars.compile(HEAVY)
        assert grammars.pool.started == 1

    try:
        asyncio.run(scenario())
    finally:
        grammars.close()


def test_a_grammar_that_does_not_compile_is_remembered_too(tokenizer) -> None:
    grammars = _engine(tokenizer, budget_s=10, wait_s=60)
    bad = StructuredOutput("regex", "([")

    async def scenario() -> None:
        for _ in range(2):
            with pytest.raises(InvalidRequestError, match="does not compile"):
                await grammars.prepare(bad)
        assert grammars.pool.started == 1

    try:
        asyncio.run(scenario())
    finally:
        grammars.close()


def _blocker() -> tuple[Callable[[], str], threading.Event, threading.Event]:
    """A job that waits (GIL released, no CPU) until released; and its started/release events."""
    started, release = threading.Event(), threading.Event()

    def fn() -> str:
        started.set()
        release.wait()
        return "done"

    return fn, started, release


def test_the_queue_is_bounded_and_a_key_in_flight_is_shared() -> None:
    pool = CompilePool(budget_s=600, max_queued=1)
    fn, started, release = _blocker()
    try:
        running = pool.submit("a", fn)
        assert started.wait(60)  # "a" runs: the queue is empty again
        queued = pool.submit("b", lambda: "b")
        assert pool.submit("b", lambda: "other") is queued
        assert pool.submit("a", lambda: "other") is running
        with pytest.raises(CompilerBusy):
            pool.submit("c", lambda: "c")
        release.set()
        assert (running.result(60), queued.result(60)) == ("done", "b")
        assert pool.started == 2
    finally:
        release.set()
        pool.close()


def test_runaway_threads_are_capped_before_the_next_job_starts() -> None:
    pool = CompilePool(budget_s=0.02, max_overrun=1)
    order: list[str] = []
    stop = threading.Event()

    def spin() -> None:  # burns CPU until told to stop: always past a 20 ms budget
        while not stop.is_set():
            pass
        order.append("runaway ended")

    def after() -> str:
        order.append("next started")
        return "ok"

    try:
        first = pool.submit("spin", spin)
        with pytest.raises(CompileOverBudget):
            first.result(60)
        nxt = pool.submit("next", after)
        assert pool.overrunning == 1 and not nxt.done()
        stop.set()  # the runaway ends; only then may the next job start
        assert nxt.result(60) == "ok"
        assert order == ["runaway ended", "next started"]
    finally:
        stop.set()
        pool.close()


def test_the_worker_flags_set_the_budget_and_the_wait() -> None:
    import argparse

    from tandem.engine.cli_args import add_engine_args, engine_config_from_args

    parser = add_engine_args(argparse.ArgumentParser())
    config = engine_config_from_args(parser.parse_args(
        ["--grammar-compile-budget-s", "2.5", "--grammar-compile-wait-s", "4"]))
    assert (config.grammar_compile_budget_s, config.grammar_compile_wait_s) == (2.5, 4.0)
    default = engine_config_from_args(parser.parse_args([]))
    assert (default.grammar_compile_budget_s, default.grammar_compile_wait_s) == (10.0, None)
    with pytest.raises(ValueError, match="grammar_compile_budget_s"):
        engine_config_from_args(parser.parse_args(["--grammar-compile-budget-s", "0"]))
