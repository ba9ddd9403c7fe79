"""Cutting a pre-quantized checkpoint's layers over a group (tandem/engine/parallel/cut.py):
AWQ, GPTQ and compressed-tensors checkpoints written by tandem/engine/testing/prequantized.py
(each format's own packing), loaded, then cut. Every rank's slice dequantizes to exactly the
same rows / columns of the whole layer (whole groups with their own scales and zeros), the
row-parallel partial products summed over the ranks equal the whole layer, and a split that
would cut a group is refused naming the numbers before any rank starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tandem.engine import EngineConfig, LLMEngine
from tandem.engine.checkpoint import tp_group
from tandem.engine.config import ModelConfig
from tandem.engine.models.causal_lm import CausalLM
from tandem.engine.models.weights import load_model
from tandem.engine.parallel.cut import cut_cols, span_index
from tandem.engine.parallel.plan import Span, TensorParallelError
from tandem.engine.parallel.shard import rank_shard, shard_model
from tandem.engine.quant import Int4Linear, Int8Linear
from tandem.engine.testing.prequantized import QuantSpec, write_prequantized

HIDDEN = 128  # 4 heads of 32: 64 o_proj columns per rank of 2, 128 down_proj columns
SPECS = {
    "awq-g32": QuantSpec("awq", 32),
    "gptq-g64-asym": QuantSpec("gptq", 64),
    "ct-int4-g32-sym": QuantSpec("compressed-tensors", 32, symmetric=True),
    "ct-int8-channel": QuantSpec("compressed-tensors", bits=8, symmetric=True),
    "awq-g128": QuantSpec("awq", 128),
}
GROUPS = {"awq-g32": 32, "gptq-g64-asym": 64, "ct-int4-g32-sym": 32, "ct-int8-channel": None,
          "awq-g128": 128}


@pytest.fixture(scope="module")
def quantized(tiny_dir, tmp_path_factory: pytest.TempPathFactory):
    """``quantized(spec name, arch)``: that checkpoint, written once per module."""
    made: dict[tuple[str, str], Path] = {}

    def get(name: str, arch: str = "llama") -> Path:
        if (name, arch) not in made:
            dense = tiny_dir(arch, 2, hidden_size=HIDDEN)
            out = tmp_path_factory.mktemp(f"{name}-{arch}") / "q"
            write_prequantized(dense, out, SPECS[name])
            made[name, arch] = out
        return made[name, arch]

    return get


def _load(path: Path) -> CausalLM:
    return load_model(path, torch.float32, torch.device("cpu"), 64, progress=False)[0]


@pytest.mark.parametrize(("name", "arch"), [
    ("awq-g32", "llama"), ("gptq-g64-asym", "qwen2"), ("ct-int4-g32-sym", "llama"),
    ("ct-int8-channel", "llama"), ("awq-g32", "qwen3_moe")])
def test_every_rank_holds_exactly_its_slice_of_the_stored_values(quantized, name: str,
                                                                  arch: str) -> None:
    """qwen2: q/k/v biases (kept per row); qwen3_moe: every expert's slice of the expert
    width, each expert still quantized."""
    path = quantized(name, arch)
    kind = Int8Linear if SPECS[name].bits == 8 else Int4Linear
    whole, world = _load(path), 2
    assert tp_group(ModelConfig(model=str(path)), None, path) == GROUPS[name]
    torch.manual_seed(0)
    x = torch.randn(80, HIDDEN)  # >= 64 rows: the layers' fp32 GEMM on dequantized weights
    o_in = torch.randn(80, whole.arch.num_heads * whole.arch.head_dim)
    dense = [i for i, layer in enumerate(whole.layers) if hasattr(layer.mlp, "down_proj")]
    with torch.no_grad():
        o_sum, mlp_sum = torch.zeros(80, HIDDEN), torch.zeros(80, HIDDEN)
        for r in range(world):
            part = _load(path)
            shard = rank_shard(whole.arch, world, r, group=GROUPS[name])
            cuts = shard_model(part, shard)
            assert any(".experts." in n for n in cuts) == (arch == "qwen3_moe")
            for module, cut in cuts.items():
                mine, full = part.get_submodule(module), whole.get_submodule(module)
                assert isinstance(mine, kind), module
                if isinstance(cut, Span):  # row-parallel: input columns, bias on rank 0
                    want = full.dequantize()[:, cut.start : cut.stop]
                    assert (mine.bias is not None) == (full.bias is not None and r == 0)
                else:  # column-parallel: output rows with their bias rows
                    rows = torch.from_numpy(span_index(cut))
                    want = full.dequantize()[rows]
                    if full.bias is not None:
                        assert torch.equal(mine.bias, full.bias[rows])
                assert torch.equal(mine.dequantize(), want), module
            o = shard.o_cols()
            o_sum += part.layers[0].self_attn.o_proj(o_in[:, o.start : o.stop])
            if dense:
                mlp_sum += part.layers[dense[0]].mlp(x)
        first = whole.layers[0]
        torch.testing.assert_close(o_sum, first.self_attn.o_proj(o_in))
        if dense:
            torch.testing.assert_close(mlp_sum, whole.layers[dense[0]].mlp(x))


def test_a_split_that_cuts_a_group_is_refused_before_any_rank_starts(quantized) -> None:
    """Groups of 128 over 2 ranks: 64 o_proj columns each, half a group."""
    path = quantized("awq-g128")
    with pytest.raises(TensorParallelError, match="64 columns per rank over "
                       "--tensor-parallel-size 2, not a multiple of the quantization group "
                       "of 128"):
        LLMEngine(EngineConfig.from_kwargs(model=str(path), num_blocks=8, num_threads=1,
                                           tensor_parallel_size=2), progress=False)
    # the layer itself refuses a cut through a group, whatever asked for it
    o_proj = _load(path).layers[0].self_attn.o_proj
    with pytest.raises(TensorParallelError, match="columns 0..64 of 128 cut a quantization "
                       "group of 128"):
        cut_cols(o_proj, Span(0, 64), True, "layers.0.self_attn.o_proj")
