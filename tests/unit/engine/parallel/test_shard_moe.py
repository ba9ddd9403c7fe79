"""Cutting a mixture-of-experts model over a group (tandem/engine/parallel/shard.py), in one
process: each rank keeps every routed expert's slice of the expert width and its slice of the
shared expert, the router and the shared expert's gate whole; the ranks' block outputs summed
(the one all-reduce a MoE layer runs) equal the whole block, a dense layer beside it splits as
before, and the rank's arch carries its widths. Expert parallel: each rank holds exactly its
whole experts, loaded from a checkpoint that lacks every other expert's tensors."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

from tandem.engine.models.layers import MLP, SparseMoE
from tandem.engine.models.layers.moe_experts import AbsentExpert
from tandem.engine.models.weights import load_model
from tandem.engine.parallel.collectives import AllReduce
from tandem.engine.parallel.cut import span_index
from tandem.engine.parallel.shard import local_arch, rank_shard, reduce_row_parallel, shard_model


def _load(path):
    return load_model(path, torch.float32, torch.device("cpu"), 64, progress=False)


@pytest.mark.parametrize("world", [2, 4])
def test_moe_block_partials_sum_to_the_whole_block(tiny_dir, world: int) -> None:
    """Qwen2-MoE: 8 experts of 32, a shared expert of 64 behind its sigmoid gate in layer 1;
    layer 0 dense (128 wide)."""
    path = tiny_dir("qwen2_moe", 2, num_layers=3, decoder_sparse_step=2)
    whole, arch = _load(path)
    assert arch.moe is not None
    width, shared = arch.moe.expert_intermediate_size, arch.moe.shared_intermediate_size
    block, dense = whole.layers[1].mlp, whole.layers[0].mlp
    assert isinstance(block, SparseMoE) and block.shared_expert_gate is not None
    assert isinstance(dense, MLP)
    torch.manual_seed(0)
    x = torch.randn(7, arch.hidden_size)
    with torch.no_grad():
        moe_sum, dense_sum = torch.zeros_like(x), torch.zeros_like(x)
        for r in range(world):
            part, _ = _load(path)
            shard = rank_shard(arch, world, r, group=None)
            cuts = shard_model(part, shard)
            moe = part.layers[1].mlp
            assert torch.equal(moe.gate.weight, block.gate.weight)  # the router, whole
            assert torch.equal(moe.shared_expert_gate, block.shared_expert_gate)
            rows = torch.from_numpy(span_index(shard.gate_up_rows(width)))
            for e in range(len(block.experts)):
                assert torch.equal(moe.experts[e].gate_up_proj.weight,
                                   block.experts[e].gate_up_proj.weight[rows])
                assert cuts[f"layers.1.mlp.experts.{e}.down_proj"] == shard.split(width)
            assert moe.shared_expert.inter == shared // world
            assert cuts["layers.1.mlp.shared_expert.down_proj"] == shard.split(shared)
            moe_sum += moe(x)
            dense_sum += part.layers[0].mlp(x)
            small = local_arch(arch, shard)
            assert small.moe is not None
            assert (small.moe.expert_intermediate_size, small.moe.shared_intermediate_size,
                    small.intermediate_size) == (width // world, shared // world,
                                                 arch.intermediate_size // world)
            reduce_row_parallel(part)  # wraps only: nothing runs a collective here
            assert isinstance(part.layers[1].mlp, AllReduce)  # the block's output, once
            assert not isinstance(part.layers[1].mlp.inner.experts[0].down_proj, AllReduce)
            assert isinstance(part.layers[0].mlp.down_proj, AllReduce)
        torch.testing.assert_close(moe_sum, block(x))
        torch.testing.assert_close(dense_sum, dense(x))


def test_a_model_without_dense_layers_splits_whatever_its_dense_width(tiny_dir) -> None:
    """Every layer sparse: the config's intermediate_size (a width no layer has) does not
    refuse the split; with a dense layer beside the experts it still must divide."""
    import dataclasses

    from tandem.engine.parallel.plan import TensorParallelError

    _, sparse = _load(tiny_dir("qwen3_moe", 2))
    assert sparse.moe is not None and len(sparse.moe.sparse_layers) == sparse.num_layers
    odd = dataclasses.replace(sparse, intermediate_size=99)
    assert local_arch(odd, rank_shard(odd, 2, 1, group=None)).intermediate_size == 0
    _, mixed = _load(tiny_dir("qwen2_moe", 2, num_layers=3, decoder_sparse_step=2))
    assert mixed.moe is not None and len(mixed.moe.sparse_layers) < mixed.num_layers
    with pytest.raises(TensorParallelError, match="intermediate size 99"):
        rank_shard(dataclasses.replace(mixed, intermediate_size=99), 2, 1, group=None)


def _without_other_experts(src: Path, dst: Path, held: range) -> Path:
    """A copy of checkpoint ``src`` holding no routed expert's tensors but ``held``'s."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    for f in dst.glob("*.safetensors"):
        kept = {n: t for n, t in load_file(f).items()
                if (m := re.search(r"\.experts\.(\d+)\.", n)) is None or int(m[1]) in held}
        save_file(kept, f, metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize(("world", "sizes"), [(2, [4, 4]), (3, [3, 3, 2])])
def test_expert_parallel_ranks_hold_their_experts_and_sum_to_the_block(
        tiny_dir, tmp_path: Path, world: int, sizes: list[int]) -> None:
    """Qwen2-MoE (8 experts of 48, a shared expert of 96 behind its gate; 6 heads, 1 KV
    head), expert parallel: rank r holds exactly its contiguous experts, whole, read from a
    checkpoint without the others' tensors (AbsentExpert, no weights, in their places); the
    shared expert is split over its width; the ranks' block outputs sum to the whole block."""
    path = tiny_dir("qwen2_moe", 1, num_heads=6, hidden_size=96, num_layers=3,
                    decoder_sparse_step=2)
    whole, arch = _load(path)
    assert arch.moe is not None
    block = whole.layers[1].mlp
    torch.manual_seed(0)
    x = torch.randn(9, arch.hidden_size)
    with torch.no_grad():
        total = torch.zeros_like(x)
        for r in range(world):
            shard = rank_shard(arch, world, r, group=None, expert_parallel=True)
            assert shard.experts is not None and shard.experts.size == sizes[r]
            held = range(shard.experts.start, shard.experts.stop)
            own = _without_other_experts(path, tmp_path / f"rank{r}", held)
            part, _ = load_model(own, torch.float32, torch.device("cpu"), 64, progress=False,
                                 experts=held)
            cuts = shard_model(part, shard)
            moe = part.layers[1].mlp
            assert moe.experts.held == held
            for e, expert in enumerate(moe.experts):
                if e in held:
                    for lin in ("gate_up_proj", "down_proj"):
                        assert torch.equal(getattr(expert, lin).weight,
                                           getattr(block.experts[e], lin).weight)
                else:
                    assert isinstance(expert, AbsentExpert) and not list(expert.parameters())
            assert not any(".experts." in name for name in cuts)  # no expert is cut
            assert moe.shared_expert.inter == arch.moe.shared_intermediate_size // world
            small = local_arch(arch, shard)
            assert small.moe is not None
            assert small.moe.expert_intermediate_size == arch.moe.expert_intermediate_size
            total += moe(x)
        torch.testing.assert_close(total, block(x))
        # a rank past the experts (fewer experts than ranks) adds nothing
        weights, ids = block.gate(x)
        block.experts.keep(range(8, 8))
        assert torch.equal(block.experts(x, ids, weights), torch.zeros_like(x))
