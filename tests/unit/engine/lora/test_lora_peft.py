"""Multi-LoRA against PEFT: the engine's greedy output under each adapter equals PEFT's on the
same base and adapter, with three adapters and base rows mixed in one batch."""

from __future__ import annotations

import pytest
import torch

from tandem.engine.lora import LoraConfig
from tandem.engine.testing.lora import greedy_under_adapters, make_tiny_adapter, peft_greedy

MAX_NEW = 12


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, tiny_dir):
    base = tiny_dir("llama", 2)
    root = tmp_path_factory.mktemp("adapters")
    return base, {
        "a": make_tiny_adapter(base, root / "a", rank=4, seed=1),
        "b": make_tiny_adapter(base, root / "b", rank=8, alpha=4.0, seed=2, use_rslora=True),
        "c": make_tiny_adapter(base, root / "c", rank=2, seed=3,
                               targets=("q_proj", "v_proj", "down_proj")),
    }


def _prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 256, (int(k),), generator=g).tolist()
            for k in torch.randint(5, 40, (n,), generator=g)]


@pytest.mark.parametrize("native", [True, False])
def test_mixed_adapters_match_peft(make_engine, adapters, native) -> None:
    base, dirs = adapters
    engine = make_engine(model=str(base), num_blocks=128, block_size=16,
                         use_native_kernels=native,
                         lora=LoraConfig(enabled=True, modules=tuple(
                             (n, str(p)) for n, p in dirs.items()), max_loras=3,
                             max_lora_rank=8))
    prompts = _prompts(8, seed=4)
    # base rows run longer: the last steps carry no adapter (native: every step runs the fused
    # forward, adding the adapter rows' deltas itself)
    jobs = [(prompts[0], "a", MAX_NEW), (prompts[1], "b", MAX_NEW), (prompts[2], "", 20),
            (prompts[3], "c", MAX_NEW), (prompts[4], "a", MAX_NEW), (prompts[5], "", 20),
            (prompts[6], "b", MAX_NEW), (prompts[7], "c", MAX_NEW)]
    got = greedy_under_adapters(engine, jobs)
    for (prompt, lora, m), tokens in zip(jobs, got, strict=True):
        assert tokens == peft_greedy(base, dirs[lora] if lora else None, prompt, m), lora
    # every adapter moved the output away from the base model's
    for prompt, lora, m in jobs:
        if lora:
            assert peft_greedy(base, dirs[lora], prompt, m) != peft_greedy(base, None, prompt, m)
            break


def test_more_adapters_than_max_loras_wait_their_turn(make_engine, adapters) -> None:
    base, dirs = adapters
    engine = make_engine(model=str(base), num_blocks=128, block_size=16,
                         lora=LoraConfig(enabled=True, modules=tuple(
                             (n, str(p)) for n, p in dirs.items()), max_loras=1,
                             max_lora_rank=8))
    seen: list[set[str]] = []
    runner_execute = engine.runner.execute

    def spy(scheduled, *a, **k):
        seen.append({s.request.lora for s in scheduled} - {""})
        return runner_execute(scheduled, *a, **k)

    engine.runner.execute = spy
    prompts = _prompts(3, seed=5)
    jobs = [(prompts[0], "a", 4), (prompts[1], "b", 4), (prompts[2], "c", 4)]
    got = greedy_under_adapters(engine, jobs)
    assert all(len(s) <= 1 for s in seen) and len(seen) >= 3
    for (prompt, lora, m), tokens in zip(jobs, got, strict=True):
        assert tokens == peft_greedy(base, dirs[lora], prompt, m)
