"""An fp8 KV cache in a tensor-parallel group: each rank's cache holds its own KV heads in
e4m3 over the scales every rank reads from the checkpoint (its calibrated ``k_scale``/
``v_scale`` of each layer, or 1.0 each without them), so a group of two or three rank
processes generates exactly the single-process fp8 engine's greedy tokens, and names the
same scales in its KV layout. Every KV block is back in the pool afterwards and closing the
engine ends every rank."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tandem.engine import EngineConfig, LLMEngine, SamplingParams
from tandem.engine.quant.kv_fp8 import Fp8Scales
from tandem.worker.convert import kv_layout
from tests.conftest import assert_no_leaks
from tests.unit.engine._reference import engine_token_ids

PROMPTS = [[5, 9, 33, 7, 100, 3], [(7 * i + 3) % 250 + 3 for i in range(40)]]
# per layer (exact in float32), each layer's cache under its own
SCALES = {"model.layers.0.self_attn.k_scale": 0.5, "model.layers.0.self_attn.v_scale": 0.125,
          "model.layers.1.self_attn.k_scale": 0.25, "model.layers.1.self_attn.v_scale": 0.25}


def _with_scales(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    state = load_file(str(dest / "model.safetensors"))
    state |= {name: torch.tensor(value) for name, value in SCALES.items()}
    save_file(state, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


def _tokens(model: Path, tp: int) -> tuple[list[list[int]], str]:
    """Greedy tokens of PROMPTS and the KV layout's scales of an fp8 engine of ``tp`` ranks."""
    engine = LLMEngine(EngineConfig.from_kwargs(
        model=str(model), num_blocks=64, block_size=16, max_num_batched_tokens=32,
        tensor_parallel_size=tp, num_threads=1, kv_cache_dtype="fp8"), progress=False)
    followers = [f.proc for f in engine.group._followers] if engine.group else []
    try:
        params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
        got = engine_token_ids(engine, PROMPTS, params)
        assert str(engine.runner.kv_cache.dtype) == "torch.float8_e4m3fn"
        assert_no_leaks(engine)
        return got, kv_layout(engine.remote.kv_cache_spec()).kv_scales
    finally:
        engine.close()
        assert [p.wait(timeout=60) for p in followers] == [0] * (tp - 1)


@pytest.mark.parametrize(("kv", "tp", "calibrated"), [
    (1, 2, True), (3, 3, True), (2, 2, False)],
    ids=["kv-replicated-checkpoint-scales", "kv-split-tp3-checkpoint-scales",
         "kv-split-unit-scales"])
def test_a_group_with_an_fp8_cache_equals_one_rank(tiny_dir, tmp_path: Path, kv: int,
                                                   tp: int, calibrated: bool) -> None:
    base = tiny_dir("llama", kv, num_heads=6, hidden_size=96)
    model = _with_scales(base, tmp_path / "scaled") if calibrated else base
    want, one_scales = _tokens(model, 1)
    assert one_scales == (Fp8Scales((0.5, 0.25), (0.125, 0.25)) if calibrated
                          else Fp8Scales()).layout
    assert _tokens(model, tp) == (want, one_scales)
