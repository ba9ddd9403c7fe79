"""Cut a loaded model down to one rank's shard (tandem/engine/parallel/plan.py says which).

    load_model (whole float model) --shard_model--> this rank's rows/columns, local head counts
    GGUF blocks (read_blocks)      --shard_blocks--> the same rows/columns as raw block bytes
    quantize_model (as for one rank) --reduce_row_parallel--> o_proj, down_proj all-reduced

Sharding happens on the float layers before quantization, and on a GGUF's stored blocks by the
same spans (rows are whole runs of blocks; a column span on a multiple of 32 is a byte span),
so every weight format quantize_model builds (PackedLinear for the native kernels, Int4Linear,
Int8Linear) comes out of the slice. A pre-quantized checkpoint (AWQ, GPTQ, compressed-tensors)
is loaded quantized and is refused here for now.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import nn

from tandem.engine.models.arch import ModelArch
from tandem.engine.models.causal_lm import CausalLM
from tandem.engine.models.layers.attention import Attention
from tandem.engine.models.layers.mlp import MLP
from tandem.engine.models.linear import Linear
from tandem.engine.parallel.collectives import AllReduce
from tandem.engine.parallel.plan import RankShard, Span, TensorParallelError, plan_shards
from tandem.engine.quant.gguf_blocks import Blocks

GGUF_GROUP = 32  # values per Q4_0/Q4_1/Q8_0 block, and per int4 group
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


def rank_shard(arch: ModelArch, world: int, rank: int, quantized: bool) -> RankShard:
    """This rank's shard of ``arch``; TensorParallelError when the model does not split."""
    plan = plan_shards(world, num_heads=arch.num_heads, num_kv_heads=arch.num_kv_heads,
                       head_dim=arch.head_dim, intermediate_size=arch.intermediate_size,
                       group=GGUF_GROUP if quantized else None, moe=arch.moe is not None,
                       mla=arch.mla is not None)
    return plan.rank(rank)


def local_arch(arch: ModelArch, shard: RankShard) -> ModelArch:
    """The arch as one rank sees it: its heads, KV heads and MLP width (the KV cache and the
    runner are sized by it)."""
    return dataclasses.replace(arch, num_heads=shard.q_heads.size,
                               num_kv_heads=shard.kv_heads.size,
                               intermediate_size=shard.intermediate.size)


def shard_model(model: CausalLM, shard: RankShard) -> None:
    """Keep only ``shard``'s rows and columns of every decoder layer's linears, in place."""
    if model.quant_format != "none":
        raise TensorParallelError(
            f"the checkpoint is stored quantized ({model.quant_format}): tensor parallelism "
            "splits float and GGUF checkpoints only for now")
    with torch.no_grad():
        for layer in model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            if not isinstance(attn, Attention) or not isinstance(mlp, MLP):
                raise TensorParallelError(f"{type(attn).__name__}/{type(mlp).__name__} layers "
                                          "have no tensor-parallel split")
            attn.qkv_proj = _rows(attn.qkv_proj, shard.qkv_rows())
            attn.o_proj = _cols(attn.o_proj, shard.o_cols(), shard.adds_bias)
            attn.nh, attn.nkv = shard.q_heads.size, shard.kv_heads.size
            attn.q_size, attn.kv_size = attn.nh * attn.hd, attn.nkv * attn.hd
            mlp.gate_up_proj = _rows(mlp.gate_up_proj, shard.gate_up_rows())
            mlp.down_proj = _cols(mlp.down_proj, shard.down_cols(), shard.adds_bias)
            mlp.inter = shard.intermediate.size


def shard_blocks(stored: dict[str, Blocks], shard: RankShard) -> dict[str, Blocks]:
    """A GGUF's stored blocks (``read_blocks``) cut as :func:`shard_model` cuts the layers;
    the embedding and lm_head stay whole."""
    out: dict[str, Blocks] = {}
    for name, b in stored.items():
        if name.endswith("self_attn.qkv_proj"):
            b = Blocks(b.type, _take_rows(b.rows, shard.qkv_rows()))
        elif name.endswith("mlp.gate_up_proj"):
            b = Blocks(b.type, _take_rows(b.rows, shard.gate_up_rows()))
        elif name.endswith("self_attn.o_proj"):
            b = Blocks(b.type, _block_cols(b, shard.o_cols()))
        elif name.endswith("mlp.down_proj"):
            b = Blocks(b.type, _block_cols(b, shard.down_cols()))
        out[name] = b
    return out


def reduce_row_parallel(model: CausalLM) -> None:
    """Sum every row-parallel layer's partial output over the group (after quantization has
    built the layers this wraps)."""
    for layer in model.layers:
        layer.self_attn.o_proj = AllReduce(layer.self_attn.o_proj)
        layer.mlp.down_proj = AllReduce(layer.mlp.down_proj)


def _index(spans: list[Span]) -> np.ndarray:
    return np.concatenate([np.arange(s.start, s.stop) for s in spans])


def _take_rows(rows: np.ndarray, spans: list[Span]) -> np.ndarray:
    return np.ascontiguousarray(rows[_index(spans)])


def _block_cols(b: Blocks, cols: Span) -> np.ndarray:
    """Columns ``cols`` of a block-quantized matrix: whole blocks, so a byte range per row."""
    if cols.start % GGUF_GROUP or cols.stop % GGUF_GROUP:  # plan_shards refused it already
        raise TensorParallelError(f"columns {cols.start}..{cols.stop} cut a block of "
                                  f"{GGUF_GROUP}")
    per = _BLOCK_BYTES[b.type]
    return np.ascontiguousarray(
        b.rows[:, cols.start // GGUF_GROUP * per : cols.stop // GGUF_GROUP * per])


def _rows(lin: nn.Module, spans: list[Span]) -> Linear:
    """A column-parallel slice: the output rows in ``spans`` (and their bias)."""
    assert isinstance(lin, Linear)
    idx = torch.from_numpy(_index(spans)).to(lin.weight.device)
    return _linear(lin.weight[idx], lin.bias[idx] if lin.bias is not None else None)


def _cols(lin: nn.Module, cols: Span, bias: bool) -> Linear:
    """A row-parallel slice: the input columns ``cols``; the bias only where ``bias``."""
    assert isinstance(lin, Linear)
    keep = lin.bias if bias else None
    return _linear(lin.weight[:, cols.start : cols.stop], keep)


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
    out_f, in_f = weight.shape
    lin = Linear(in_f, out_f, bias=bias is not None, device=weight.device, dtype=weight.dtype)
    lin.weight.copy_(weight)
    if bias is not None:
        lin.bias.copy_(bias)
    return lin
