"""A LoRA adapter cut to each rank's shard (tandem/engine/parallel/lora_cut.py), in one
process: a column-parallel projection's per-rank deltas are the whole delta's rows the rank's
base keeps (its Q, K, V heads, KV heads replicated included; its gate and up rows), and a
row-parallel projection's per-rank deltas of the rank's input columns sum (what the
all-reduce does) to the whole delta."""

from __future__ import annotations

import pytest
import torch

from tandem.engine.lora.adapter import load_adapter
from tandem.engine.models.weights import read_arch
from tandem.engine.parallel.cut import span_index
from tandem.engine.parallel.lora_cut import cut_adapter
from tandem.engine.parallel.shard import rank_shard
from tandem.engine.testing.lora import write_random_adapter


@pytest.mark.parametrize(("kv", "world"), [(1, 2), (3, 3), (6, 2)])
def test_cut_deltas_make_the_whole_delta(tiny_dir, tmp_path, kv: int, world: int) -> None:
    base = tiny_dir("llama", kv, num_heads=6, hidden_size=96)
    _, arch = read_arch(base)
    path = write_random_adapter(base, tmp_path / "a", rank=4, seed=1)
    whole = load_adapter("a", path, arch, 16, torch.float32, torch.device("cpu"))
    torch.manual_seed(0)
    for (layer, group), (a, b) in whole.weights.items():
        x = torch.randn(5, a.shape[1])
        want = x @ a.T @ b.T
        row_sum = torch.zeros_like(want)
        for r in range(world):
            shard = rank_shard(arch, world, r, group=None)
            ra, rb = cut_adapter(whole, shard).weights[(layer, group)]
            if group in ("qkv_proj", "gate_up_proj"):
                spans = shard.qkv_rows() if group == "qkv_proj" else shard.gate_up_rows()
                assert torch.equal(ra, a)
                torch.testing.assert_close(x @ ra.T @ rb.T,
                                           want[:, torch.from_numpy(span_index(spans))])
            else:
                cols = shard.o_cols() if group == "o_proj" else shard.down_cols()
                assert torch.equal(rb, b) and ra.shape[1] == cols.size
                row_sum += x[:, cols.start:cols.stop] @ ra.T @ rb.T
        if group in ("o_proj", "down_proj"):
            torch.testing.assert_close(row_sum, want)
