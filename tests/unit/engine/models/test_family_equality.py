"""Each family's features against transformers: greedy output equal token for token, fp32,
on tiny checkpoints whose every parameter is perturbed (non-zero biases, norms away from one:
tandem/engine/testing/perturb.py), through the torch forward and the fused native one."""

from __future__ import annotations

import pytest
import torch

from tandem.engine import SamplingParams
from tandem.engine.native import load
from tests.unit.engine._reference import engine_token_ids, hf_greedy

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)

# name -> (arch, make_tiny_checkpoint options)
CASES = {
    "llama-attention-and-mlp-bias": ("llama", {"attention_bias": True, "mlp_bias": True}),
    # llama3 and yarn rescale the frequencies past the original context: prompts cross it
    "llama3-rope": ("llama", {"rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}}),
    "yarn-rope": ("llama", {"rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}}),
    "qwen2": ("qwen2", {}),
    "qwen2-tied": ("qwen2", {"tie_word_embeddings": True}),
    "qwen3": ("qwen3", {}),
    "qwen3-attention-bias": ("qwen3", {"attention_bias": True}),
}
PATHS = ["torch", pytest.param("native", marks=pytest.mark.skipif(
    load() is None, reason="native kernels unavailable here"))]


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(3, 256, (n,), generator=g).tolist() for n in (9, 100, 300)]


@pytest.mark.parametrize("path_kind", PATHS)
@pytest.mark.parametrize("case", list(CASES))
def test_greedy_equals_transformers(family_dir, make_engine, case: str, path_kind: str) -> None:
    arch, options = CASES[case]
    path = family_dir(arch, **options)
    engine = make_engine(model=str(path), num_blocks=96, block_size=16,
                         use_native_kernels=path_kind == "native")
    assert (engine.runner.fused is not None) == (path_kind == "native")
    prompts = _prompts()
    got = engine_token_ids(engine, prompts, GREEDY)
    for prompt, tokens in zip(prompts, got, strict=True):
        assert tokens == hf_greedy(path, prompt, GREEDY.max_tokens), case
