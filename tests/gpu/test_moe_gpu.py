"""Mixture-of-experts engines on a CUDA device: the Triton grouped-GEMM experts
(tandem/engine/models/layers/moe_triton.py) against the torch path's per-expert calls.

Two engines per family on the same GPU, fp32: one as served (its float experts stacked at
load and run by the kernels), one with every ``Experts.kernel`` set to ``"torch"``; greedy
outputs equal over prompts from a few tokens (decode: one row per expert) to a few hundred
(prefill: many rows per expert). Mixtral and Qwen3-MoE (softmax routers) and DeepSeek-V3
(grouped sigmoid routing, routed scaling, a shared expert, MLA). Skipped without CUDA; run by
scripts/gpu_check.sh on a lent GPU machine.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tandem.engine import SamplingParams
from tandem.engine.models.layers.moe_experts import Experts
from tests.unit.engine._reference import engine_token_ids

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
# name -> (arch, kv heads, make_tiny_checkpoint options)
FAMILIES = {
    "mixtral": ("mixtral", 2, {}),
    "qwen3-moe": ("qwen3_moe", 2, {"num_layers": 3, "norm_topk_prob": True}),
    "deepseek-v3": ("deepseek_v3", 4, {"num_layers": 3, "first_k_dense_replace": 1}),
}


def _experts(engine: Any) -> list[Experts]:
    found = [m for m in engine.runner.model.modules() if isinstance(m, Experts)]
    assert found, "no MoE layer"
    return found


@pytest.mark.parametrize("name", list(FAMILIES))
def test_cuda_triton_experts_equal_the_torch_path(tiny_dir, make_engine, name: str) -> None:
    arch, kv_heads, options = FAMILIES[name]
    path = tiny_dir(arch, kv_heads, **options)
    kw = dict(model=str(path), device="cuda", dtype="float32", num_blocks=256, block_size=16,
              attention_backend="triton")
    tri, ref = make_engine(**kw), make_engine(**kw)
    probe = torch.zeros(1, tri.arch.hidden_size, device="cuda")
    for experts in _experts(tri):  # stacked at load, and the kernels serve them
        assert experts.triton_weights(probe) is not None
    for experts in _experts(ref):
        experts.kernel = "torch"
        assert experts.triton_weights(probe) is None
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist()
               for n in (3, 17, 40, 100, 260, 1, 64)]
    got = engine_token_ids(tri, prompts, GREEDY)
    assert got == engine_token_ids(ref, prompts, GREEDY)
