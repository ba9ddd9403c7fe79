"""Cutting a model to one rank's shard (tandem/engine/parallel/shard.py), in one process: the
column-parallel layers keep their rows, the row-parallel layers' partial products summed over
the ranks (what the all-reduce does) equal the whole layer, and a GGUF's stored blocks cut on
block boundaries dequantize to the same slice of the weight (pre-quantized layers:
test_shard_quantized.py; mixture-of-experts blocks: test_shard_moe.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tandem.engine.models.weights import load_model
from tandem.engine.parallel.plan import TensorParallelError
from tandem.engine.parallel.shard import local_arch, rank_shard, shard_blocks, shard_model
from tandem.engine.quant.gguf_blocks import Blocks


def _load(path):
    model, arch = load_model(path, torch.float32, torch.device("cpu"), 64, progress=False)
    return model, arch


@pytest.mark.parametrize(("kv", "world"), [(1, 2), (1, 3), (3, 3), (6, 2)])
def test_row_parallel_partials_sum_to_the_whole_layer(tiny_dir, kv: int, world: int) -> None:
    path = tiny_dir("llama", kv, num_heads=6, hidden_size=96, attention_bias=True,
                    mlp_bias=True)
    whole, arch = _load(path)
    layer = whole.layers[1]
    torch.manual_seed(0)
    x = torch.randn(5, arch.hidden_size)
    o_in = torch.randn(5, arch.num_heads * arch.head_dim)
    with torch.no_grad():
        qkv_whole = layer.self_attn.qkv_proj(x)
        mlp_sum = torch.zeros_like(layer.mlp(x))
        o_sum = torch.zeros(5, arch.hidden_size)
        for r in range(world):
            part, _ = _load(path)
            shard = rank_shard(arch, world, r, group=None)
            shard_model(part, shard)
            attn, mlp = part.layers[1].self_attn, part.layers[1].mlp
            rows = torch.cat([torch.arange(s.start, s.stop) for s in shard.qkv_rows()])
            torch.testing.assert_close(attn.qkv_proj(x), qkv_whole[:, rows])
            assert (attn.nh, attn.nkv) == (6 // world, max(1, kv // world))
            assert (attn.o_proj.bias is not None) == (r == 0)
            cols = shard.o_cols()
            o_sum += attn.o_proj(o_in[:, cols.start : cols.stop])
            mlp_sum += mlp(x)
            small = local_arch(arch, shard)
            assert (small.num_kv_heads, small.intermediate_size) == \
                (shard.kv_heads.size, arch.intermediate_size // world)
        torch.testing.assert_close(o_sum, layer.self_attn.o_proj(o_in))
        torch.testing.assert_close(mlp_sum, layer.mlp(x))


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_stored_blocks_are_cut_on_block_boundaries(kind: str) -> None:
    from gguf import GGMLQuantizationType, quants

    from tandem.engine.parallel.plan import plan_shards

    qtype = GGMLQuantizationType[kind]
    rng = np.random.default_rng(0)
    # a SmolLM2-shaped split in miniature: 3 heads of 64 over 3 ranks, MLP 96 per rank
    plan = plan_shards(3, num_heads=3, num_kv_heads=3, head_dim=64, intermediate_size=288,
                       group=32)
    hidden = 64
    weights = {
        "layers.0.self_attn.qkv_proj": rng.standard_normal((9 * 64, hidden)),
        "layers.0.self_attn.o_proj": rng.standard_normal((hidden, 3 * 64)),
        "layers.0.mlp.gate_up_proj": rng.standard_normal((2 * 288, hidden)),
        "layers.0.mlp.down_proj": rng.standard_normal((hidden, 288)),
        "embed_tokens": rng.standard_normal((10, hidden)),
    }
    stored = {k: Blocks(kind, quants.quantize(w.astype(np.float32), qtype))
              for k, w in weights.items()}
    for r in range(3):
        s = plan.rank(r)
        cut = shard_blocks(stored, {  # what shard_model returns for this layer
            "layers.0.self_attn.qkv_proj": s.qkv_rows(),
            "layers.0.self_attn.o_proj": s.o_cols(),
            "layers.0.mlp.gate_up_proj": s.gate_up_rows(),
            "layers.0.mlp.down_proj": s.down_cols()})
        full = {k: quants.dequantize(b.rows, qtype) for k, b in stored.items()}
        mine = {k: quants.dequantize(b.rows, qtype) for k, b in cut.items()}
        rows = lambda spans: np.concatenate([np.arange(x.start, x.stop) for x in spans])  # noqa: E731
        np.testing.assert_array_equal(mine["layers.0.self_attn.qkv_proj"],
                                      full["layers.0.self_attn.qkv_proj"][rows(s.qkv_rows())])
        np.testing.assert_array_equal(mine["layers.0.mlp.gate_up_proj"],
                                      full["layers.0.mlp.gate_up_proj"][rows(s.gate_up_rows())])
        o, d = s.o_cols(), s.down_cols()
        np.testing.assert_array_equal(mine["layers.0.self_attn.o_proj"],
                                      full["layers.0.self_attn.o_proj"][:, o.start : o.stop])
        np.testing.assert_array_equal(mine["layers.0.mlp.down_proj"],
                                      full["layers.0.mlp.down_proj"][:, d.start : d.stop])
        np.testing.assert_array_equal(mine["embed_tokens"], full["embed_tokens"])  # replicated


def test_a_quantized_split_off_block_boundaries_is_refused(tiny_dir) -> None:
    _, arch = _load(tiny_dir("llama", 2))  # 4 heads of 16: 2 heads = 32 columns per rank
    rank_shard(arch, 2, 1, group=32)
    with pytest.raises(TensorParallelError, match="not a multiple of the quantization group"):
        rank_shard(arch, 4, 1, group=32)  # 16 columns per rank
