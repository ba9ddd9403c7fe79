"""LoRA adapters in a tensor-parallel group (tandem/engine/parallel/lora_cut.py): an engine
split over two rank processes (gloo on loopback), one adapter given at start and one loaded
at runtime, generates exactly the single-process engine's greedy tokens under the two adapters
and the base model in one batch; an adapter unloaded and a new one loaded under its name at
runtime reach every rank. Every KV block is back in the pool afterwards and closing the engine
ends every rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.engine import EngineConfig, LLMEngine
from tandem.engine.lora import LoraConfig
from tandem.engine.testing.lora import greedy_under_adapters, write_random_adapter
from tests.conftest import assert_no_leaks

NEW = 10
PROMPTS = [[5, 9, 33, 7, 100, 3], [(7 * i + 3) % 250 + 3 for i in range(40)],
           [200, 1, 4, 6, 9, 10, 11]]


def _engine(base: Path, tp: int, modules: tuple[tuple[str, str], ...]) -> LLMEngine:
    return LLMEngine(EngineConfig.from_kwargs(
        model=str(base), num_blocks=64, block_size=16, max_num_batched_tokens=32,
        tensor_parallel_size=tp, num_threads=1, kv_cache_dtype="float32",
        lora=LoraConfig(enabled=True, modules=modules, max_loras=2, max_lora_rank=8)),
        progress=False)


def _jobs(first: str, second: str) -> list[tuple[list[int], str, int]]:
    return [(PROMPTS[0], first, NEW), (PROMPTS[1], second, NEW), (PROMPTS[2], "", NEW),
            (PROMPTS[2], first, NEW)]


@pytest.mark.parametrize("kv", [1, 2], ids=["kv-heads-replicated", "kv-heads-split"])
def test_two_adapters_and_the_base_over_two_ranks_equal_one_rank(tiny_dir, tmp_path: Path,
                                                                 kv: int) -> None:
    """Adapter a on every projection (rank 4), b on q, v and down only (rank 8); biases on
    q/k/v/o and the MLP, so a row-parallel bias (rank 0's) and delta (every rank's) meet in
    the all-reduce."""
    base = tiny_dir("llama", kv, num_heads=6, hidden_size=96, attention_bias=True,
                    mlp_bias=True)
    a = write_random_adapter(base, tmp_path / "a", rank=4, seed=1)
    b = write_random_adapter(base, tmp_path / "b", rank=8, seed=2,
                             targets=("q_proj", "v_proj", "down_proj"))
    c = write_random_adapter(base, tmp_path / "c", rank=2, seed=3)
    one = _engine(base, 1, (("a", str(a)), ("b", str(b)), ("c", str(c))))
    try:
        want = greedy_under_adapters(one, _jobs("a", "b"))
        want_c = greedy_under_adapters(one, _jobs("c", "b"))
    finally:
        one.close()
    assert len({tuple(t) for t in want}) == 4  # each adapter moves the base's tokens
    group = _engine(base, 2, (("a", str(a)),))
    assert group.loras is not None and group.group is not None
    followers = [f.proc for f in group.group._followers]
    try:
        group.loras.register("b", str(b))  # the worker's runtime load path
        assert greedy_under_adapters(group, _jobs("a", "b")) == want
        group.loras.unregister("a", group.runs_adapter)
        group.loras.register("a", str(c))  # a's name now holds c's bytes, on every rank
        assert greedy_under_adapters(group, _jobs("a", "b")) == want_c
        assert_no_leaks(group)
    finally:
        group.close()
    assert [p.wait(timeout=60) for p in followers] == [0]
