"""The activation reserve (tandem/engine/kv_budget.py) against what a mixture-of-experts step
allocates, measured on the CPU with torch's memory profiler: a MoE layer's peak stays within
its per-token term for every router and dtype (every token forced onto the same two experts, the
widest an expert's intermediate gets), and a whole step of a tiny MoE model stays within the
reserve the engine would keep for it, which the dense-only count did not cover."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from torch.profiler._memory_profiler import Action

from tandem.engine import SamplingParams
from tandem.engine.kv_budget import MARGIN_BYTES, activation_reserve, moe_bytes
from tandem.engine.models.arch import ModelArch, MoeArch
from tandem.engine.models.layers import SparseMoE
from tandem.engine.testing.perturb import perturb_parameters

HIDDEN = 64


def measured_peak(fn: Callable[[], object]) -> int:
    """The most bytes the CPU held at once in tensors ``fn`` allocated (its result too)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        fn()
    live = peak = 0
    for _, action, _, size in prof._memory_profile().timeline:
        if action == Action.CREATE:
            live += size
        elif action == Action.DESTROY:
            live -= size
        peak = max(peak, live)
    return peak


def _arch(moe: MoeArch) -> ModelArch:
    return ModelArch(model_type="test", vocab_size=256, hidden_size=HIDDEN,
                     intermediate_size=2 * HIDDEN, num_layers=2, num_heads=4, num_kv_heads=2,
                     head_dim=HIDDEN // 4, rms_norm_eps=1e-6, tie_word_embeddings=False,
                     max_position_embeddings=256, eos_token_ids=(2,), moe=moe)


LAYERS = {
    "mixtral": MoeArch(8, 2, 128, (0, 1)),
    "qwen2-moe": MoeArch(32, 8, 32, (0, 1), norm_topk_prob=False, shared_intermediate_size=64,
                         shared_expert_gate=True),
    "deepseek-v3": MoeArch(32, 8, 32, (0, 1), routing="deepseek_v3", n_group=4, topk_group=2,
                           routed_scaling_factor=2.5, shared_intermediate_size=32),
}


@pytest.mark.parametrize("rows", [96, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(LAYERS))
def test_a_moe_layers_peak_is_within_its_term(case: str, dtype: torch.dtype, rows: int) -> None:
    moe = LAYERS[case]
    layer = SparseMoE(_arch(moe)).eval()
    perturb_parameters(layer, seed=1)
    layer.to(dtype)
    x = torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(rows))
    x[:, 0] = 4.0
    x = x.to(dtype)
    with torch.no_grad():
        # experts 0 and 1 (one group) score highest for every token: each runs over all rows
        layer.gate.weight[:2] = 0.0
        layer.gate.weight[:, 0] = -50.0
        layer.gate.weight[:2, 0] = 50.0
        counts = torch.bincount(layer.gate(x)[1].flatten(), minlength=moe.num_experts)
        assert counts[:2].tolist() == [rows, rows]
        peak = measured_peak(lambda: layer(x))
    term = rows * moe_bytes(moe, HIDDEN, dtype.itemsize)
    assert peak <= term
    # the dense-only count, 3 x the expert's width a token, was a fraction of it
    assert rows * dtype.itemsize * 3 * moe.expert_intermediate_size < peak


def test_a_moe_models_step_stays_within_the_reserve(tiny_dir, make_engine) -> None:
    """A 200-token prefill of a Qwen2-MoE-like model (32 experts, 8 a token, a gated shared
    expert): the step's peak beside weights and KV is within the reserve less its fixed
    margin; the dense-only reserve fell short of it. (The torch backend's prefill attention
    holds its [heads, T, T] scores, which the reserve leaves to the margin: CUDA backends
    never materialise them. At 200 tokens they are 0.6 MB of the 1.5 MB peak.)"""
    tokens = 200
    path = tiny_dir("qwen2_moe", 2, num_experts=32, num_experts_per_tok=8)
    engine = make_engine(model=str(path), num_blocks=64, block_size=16,
                         use_native_kernels=False, max_num_batched_tokens=tokens, max_num_seqs=4)
    engine.add_request(list(range(3, 3 + tokens)), SamplingParams(temperature=0.0, max_tokens=2))
    with torch.no_grad():
        peak = measured_peak(engine.step)
    while engine.has_unfinished():
        engine.step()
    act_bytes = engine.dtype.itemsize
    reserve = activation_reserve(engine.arch, tokens, 4, act_bytes) - MARGIN_BYTES
    assert peak <= reserve
    dense_only = replace(engine.arch, moe=None)
    assert activation_reserve(dense_only, tokens, 4, act_bytes) - MARGIN_BYTES < peak
