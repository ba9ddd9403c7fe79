"""AsyncEngine: calls and streams across the engine thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from tandem.engine import InvalidRequestError, SamplingParams
from tandem.engine.async_engine import AsyncEngine, EngineDeadError
from tandem.engine.llm_engine import LLMEngine
from tandem.engine.outputs import RequestOutput
from tests.unit.engine._forward_hold import ForwardHold
from tests.unit.engine._reference import hf_greedy
from tests.unit.worker.harness import until

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def test_concurrent_streams_and_errors(tiny_dir, make_engine) -> None:
    path = tiny_dir("llama", 2)
    engine = make_engine(model=str(path), num_blocks=64)
    prompts = [[5, 6, 7], list(range(10, 40)), [9] * 17]

    async def main() -> list[list[int]]:
        ae = AsyncEngine(engine)

        async def one(i: int, prompt: list[int]) -> list[int]:
            rid = f"r{i}"
            await ae.call(lambda e: e.add_request(prompt, GREEDY, request_id=rid), stream=rid)
            tokens: list[int] = []
            async for out in ae.outputs(rid):
                tokens += out.new_token_ids
            return tokens

        got = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        with pytest.raises(InvalidRequestError):
            await ae.call(lambda e: e.add_request([], GREEDY), stream="bad")
        assert not ae.has_stream("bad")
        await ae.shutdown()
        with pytest.raises(EngineDeadError):
            await ae.call(lambda e: e.stats())
        return got

    got = asyncio.run(main())
    for prompt, tokens in zip(prompts, got, strict=True):
        assert tokens == hf_greedy(path, prompt, GREEDY.max_tokens)


def test_abort_through_the_thread(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64)

    async def main() -> str | None:
        ae = AsyncEngine(engine)
        long = SamplingParams(temperature=0.0, max_tokens=500, ignore_eos=True)
        await ae.call(lambda e: e.add_request([3, 4, 5], long, request_id="a"), stream="a")
        reason = None
        async for out in ae.outputs("a"):
            if len(out.token_ids) == 3:
                await ae.call(lambda e: e.abort("a"))
                ae.close_stream("a")
                reason = "aborted"
                break
        await ae.shutdown()
        return reason

    assert asyncio.run(main()) == "aborted"


def test_on_busy_follows_the_engine_from_idle_to_work_and_back(tiny_dir, make_engine) -> None:
    """What a prefill worker lending its idle cores publishes (tandem/worker/core_lending.py): idle
    at start, busy once a request is in, idle when the last one finished."""
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64)
    seen: list[bool] = []

    async def main() -> None:
        ae = AsyncEngine(engine, on_busy=seen.append)
        for rid in ("a", "b"):
            await ae.call(lambda e, rid=rid: e.add_request([5, 6, 7], GREEDY, request_id=rid),
                          stream=rid)
            async for out in ae.outputs(rid):
                if out.finished:
                    break
            await ae.call(lambda e: None)  # the thread has looked again since the last step
        await ae.shutdown()

    asyncio.run(main())
    assert seen == [False, True, False, True, False]


def test_stats_while_a_step_runs_does_not_wait_for_its_end(tiny_dir, make_engine) -> None:
    """A prefill worker's step of a long prompt runs seconds; its Stats answers with the
    counters as of the step's start instead of waiting (the router's probe gives up after a
    second and kept a stale step-cost fit: tandem/engine/async_engine.py)."""
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64)
    entered, release = threading.Event(), threading.Event()

    def observer(rows: int, tokens: int, context: int, seconds: float) -> None:
        if not entered.is_set():  # hold the first step (the prompt's) until released
            entered.set()
            release.wait()

    engine.step_costs.observer = observer

    async def main() -> None:
        ae = AsyncEngine(engine)
        one = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
        await ae.call(lambda e: e.add_request([5, 6, 7], one, request_id="a"), stream="a")
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, entered.wait, 60)
        try:  # the step cannot end before release: waiting for it would time out here
            during = await asyncio.wait_for(ae.stats(), 60)
        finally:
            release.set()
        assert during.num_waiting + during.num_running == 1  # the request, as the step began
        assert during.num_steps == 0
        async for out in ae.outputs("a"):
            if out.finished:
                break
        await ae.call(lambda e: None)  # the thread has looked again since the last step
        after = await ae.stats()  # idle: from the engine thread, fresh
        assert after.num_running == after.num_waiting == 0 and after.num_steps == 2
        await ae.shutdown()

    asyncio.run(main())


def test_call_now_runs_at_once_only_with_nothing_queued_ahead(tiny_dir, make_engine) -> None:
    """call_now on an idle engine runs on the calling thread, and a request it adds is
    stepped (the waiting engine thread is woken). Forced order: the engine thread held
    inside a step's forward (the bookkeeping lock free), call_now runs on the calling
    thread at once; with a call queued (it waits for the step's end), call_now queues behind
    it instead and runs after it, on the engine thread. Held inside a call (the lock
    taken), call_now queues too. After shutdown it raises."""
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64)

    async def main() -> None:
        ae = AsyncEngine(engine)
        here = threading.get_ident()

        def mark(name: str) -> Callable[[LLMEngine], int]:
            def fn(e: LLMEngine) -> int:
                order.append(name)
                return threading.get_ident()
            return fn

        async def queued() -> int:
            return ae.pending_calls()

        async def inside() -> bool:
            return hold.inside.is_set()

        order: list[str] = []
        assert await ae.call_now(mark("idle")) == here
        await ae.call_now(lambda e: e.add_request([3, 4, 5], GREEDY, request_id="w"),
                          stream="w")

        async def read(rid: str) -> list[RequestOutput]:
            return [out async for out in ae.outputs(rid)]

        outs = await asyncio.wait_for(read("w"), 60)  # stepped: not left waiting
        assert outs[-1].finished and len(outs[-1].token_ids) == GREEDY.max_tokens
        hold = ForwardHold(engine.runner)
        try:
            await ae.call(lambda e: e.add_request([3, 4, 5], GREEDY, request_id="a"),
                          stream="a")
            await until(inside, bool)  # its first step is held in the forward
            assert await ae.call_now(mark("inline")) == here  # beside the forward
            behind = ae.submit(mark("queued"))
            now = asyncio.ensure_future(ae.call_now(mark("after")))
            await until(queued, lambda n: n == 2)  # both wait for the step's end
        finally:
            hold.lift.set()
        assert await behind != here and await now != here
        assert order == ["idle", "inline", "queued", "after"]
        outs = await read("a")
        assert outs[-1].finished and len(outs[-1].token_ids) == GREEDY.max_tokens

        gate = threading.Event()
        held = ae.submit(lambda e: gate.wait(60))
        await until(queued, lambda n: n == 0)  # the engine thread is inside it
        try:
            now = asyncio.ensure_future(ae.call_now(mark("behind a call")))
            await until(queued, lambda n: n == 1)  # the lock taken: queued
        finally:
            gate.set()
        assert await held and await now != here
        await ae.shutdown()
        with pytest.raises(EngineDeadError):
            await ae.call_now(lambda e: e.stats())

    asyncio.run(main())
