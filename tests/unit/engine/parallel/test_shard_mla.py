"""Cutting a multi-head latent attention model (DeepSeek-V2/V3) over a group
(tandem/engine/parallel/shard_mla.py), in one process: each rank keeps its query heads' rows of
q_proj / q_b_proj and kv_b_proj and their o_proj columns, the latent projections and norms
whole (so every rank writes the whole latent cache), and DeepSeek's MoE blocks split as every
MoE block does with the router (V3's grouped sigmoid scores and correction bias) and the
shared experts' slices; the ranks' o_proj and MoE partials summed equal the whole layers."""

from __future__ import annotations

import pytest
import torch

from tandem.engine.models.layers import SparseMoE
from tandem.engine.models.layers.mla import MlaAttention
from tandem.engine.models.weights import load_model
from tandem.engine.parallel.cut import span_index
from tandem.engine.parallel.shard import local_arch, rank_shard, reduce_row_parallel, shard_model

MOE = {"num_layers": 3, "first_k_dense_replace": 1}  # layer 0 dense, layers 1 and 2 MoE


def _load(path):
    return load_model(path, torch.float32, torch.device("cpu"), 64, progress=False)


def _q(attn: MlaAttention, x: torch.Tensor) -> torch.Tensor:
    if attn.q_lora:
        return attn.q_b_proj(attn.q_a_layernorm(attn.q_a_proj(x)))
    return attn.q_proj(x)


@pytest.mark.parametrize(("arch_name", "world"), [("deepseek_v2", 2), ("deepseek_v2", 4),
                                                  ("deepseek_v3", 2)])
def test_heads_split_the_latent_stays_whole(tiny_dir, arch_name: str, world: int) -> None:
    path = tiny_dir(arch_name, 4, attention_bias=True, **MOE)
    whole, arch = _load(path)
    m = arch.mla
    assert m is not None and arch.num_heads == 4
    torch.manual_seed(0)
    x = torch.randn(5, arch.hidden_size)
    o_in = torch.randn(5, arch.num_heads * m.v_head_dim)
    full = whole.layers[1]
    assert isinstance(full.self_attn, MlaAttention) and isinstance(full.mlp, SparseMoE)
    with torch.no_grad():
        q_whole = _q(full.self_attn, x)
        o_sum, moe_sum = torch.zeros(5, arch.hidden_size), torch.zeros(5, arch.hidden_size)
        for r in range(world):
            part, _ = _load(path)
            shard = rank_shard(arch, world, r, group=None)
            cuts = shard_model(part, shard)
            attn, moe = part.layers[1].self_attn, part.layers[1].mlp
            assert attn.nh == arch.num_heads // world
            # the latent: whole on every rank
            for name in ("kv_a_proj_with_mqa", "kv_a_layernorm") + (
                    ("q_a_proj", "q_a_layernorm") if attn.q_lora else ()):
                for key, value in getattr(attn, name).state_dict().items():
                    assert torch.equal(value, getattr(full.self_attn, name).state_dict()[key])
                assert f"layers.1.self_attn.{name}" not in cuts
            # the rank's heads: their q rows, their kv_b_proj rows (W_UK and W_UV)
            heads = shard.q_heads
            q_rows = torch.from_numpy(span_index([heads.scaled(m.qk_head_dim)]))
            torch.testing.assert_close(_q(attn, x), q_whole[:, q_rows])
            kv_rows = torch.from_numpy(span_index([heads.scaled(m.qk_nope_head_dim
                                                                + m.v_head_dim)]))
            assert torch.equal(attn.kv_b_proj.weight, full.self_attn.kv_b_proj.weight[kv_rows])
            cols = heads.scaled(m.v_head_dim)
            assert cuts["layers.1.self_attn.o_proj"] == cols
            assert (attn.o_proj.bias is not None) == (r == 0)
            o_sum += attn.o_proj(o_in[:, cols.start : cols.stop])
            # DeepSeek's MoE: the router whole, every expert and the shared experts sliced
            assert torch.equal(moe.gate.weight, full.mlp.gate.weight)
            if arch_name == "deepseek_v3":
                assert torch.equal(moe.gate.e_score_correction_bias,
                                   full.mlp.gate.e_score_correction_bias)
            assert moe.shared_expert.inter == arch.moe.shared_intermediate_size // world
            moe_sum += moe(x)
            small = local_arch(arch, shard)
            assert small.num_heads == arch.num_heads // world
            assert small.kv_shape == arch.kv_shape  # every rank caches the whole latent
            reduce_row_parallel(part)  # wraps only: nothing runs a collective here
        torch.testing.assert_close(o_sum, full.self_attn.o_proj(o_in))
        torch.testing.assert_close(moe_sum, full.mlp(x))
