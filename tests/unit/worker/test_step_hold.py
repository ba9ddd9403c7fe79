"""The test-only step hold over a real engine thread: with the hold file there, a request stops
at k output tokens while engine calls still run; without it the request runs to its end,
equal to an unheld run; unset, the environment gives no hold at all."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tandem.engine import SamplingParams
from tandem.engine.async_engine import AsyncEngine
from tandem.worker.step_hold import ENV, StepHold
from tests.unit.engine._reference import hf_greedy

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPT = [5, 6, 7, 8]


def test_a_request_stops_at_k_tokens_until_the_hold_is_lifted(tiny_dir, make_engine,
                                                               tmp_path: Path) -> None:
    path = tiny_dir("llama", 2)
    engine = make_engine(model=str(path), num_blocks=64)
    (tmp_path / "hold").write_text("3")

    async def main() -> tuple[list[int], list[int]]:
        ae = AsyncEngine(engine, pause=StepHold(tmp_path).paused)
        await ae.call(lambda e: e.add_request(PROMPT, GREEDY, request_id="a"), stream="a")
        tokens: list[int] = []
        outputs = ae.outputs("a")
        while len(tokens) < 3:
            tokens += (await anext(outputs)).new_token_ids
        # Calls run while held, and no step between them: the count stays at 3.
        counts = [await ae.call(lambda e: e.live("a").request.num_output_tokens)
                  for _ in range(3)]
        (tmp_path / "hold").unlink()
        async for out in outputs:
            tokens += out.new_token_ids
        await ae.shutdown()
        return counts, tokens

    counts, tokens = asyncio.run(main())
    assert counts == [3, 3, 3]
    assert tokens == hf_greedy(path, PROMPT, GREEDY.max_tokens)


def test_no_hold_unless_the_environment_names_a_directory(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert StepHold.from_env() is None
    monkeypatch.setenv(ENV, str(tmp_path))
    assert StepHold.from_env() is not None
