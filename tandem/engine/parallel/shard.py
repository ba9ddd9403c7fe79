"""Cut a loaded model down to one rank's shard (tandem/engine/parallel/plan.py says which).

    load_model (float, or a pre-quantized checkpoint's int4/int8 layers)
        --shard_model--> this rank's rows/columns (cut.py), local head counts; returns the cuts
    GGUF blocks (read_blocks) --shard_blocks(cuts)--> the same rows/columns as raw block bytes
    quantize_model (as for one rank) --reduce_row_parallel--> o_proj, down_proj all-reduced
                                                              (a MoE block's output: once)

Sharding happens on the layers as loaded, before quantize_model: float layers (so every
format quantize_model builds, PackedLinear for the native kernels, Int4Linear, Int8Linear,
comes out of the slice), a pre-quantized checkpoint's Int4Linear/Int8Linear (AWQ, GPTQ,
compressed-tensors: cut on whole groups), and a GGUF's stored blocks by the same spans (rows
are whole runs of blocks; a column span on a multiple of 32 is a byte span).

A mixture-of-experts block is split inside every expert (expert-sliced tensor parallelism, as
vLLM's fused MoE does): each rank holds every routed expert's slice of the expert width and
its slice of the shared expert, the router (and a shared expert's gate) whole. Every rank
routes the same hidden states to the same experts, sums its slices' partial products over
its tokens, and the block's output is all-reduced once per layer.

With expert parallelism (``--enable-expert-parallel``: ``RankShard.experts``) each rank holds
whole routed experts instead, loaded alone (load_model's ``experts``: the others' tensors are
never read, a GGUF's blocks of them never built), and computes every token's terms of its own
experts (zero for a token routed to none of them); the shared expert is split as above, and
the block's output is all-reduced once as above, which adds the ranks' experts' terms.

Multi-head latent attention (DeepSeek-V2/V3) splits its query heads and keeps the latent whole
on every rank (shard_mla.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from torch import nn

from tandem.engine.models.arch import ModelArch
from tandem.engine.models.causal_lm import CausalLM
from tandem.engine.models.layers.attention import Attention
from tandem.engine.models.layers.mla import MlaAttention
from tandem.engine.models.layers.mlp import MLP
from tandem.engine.models.layers.moe import SparseMoE
from tandem.engine.parallel.collectives import AllReduce
from tandem.engine.parallel.cut import cut_cols, cut_rows, span_index
from tandem.engine.parallel.plan import RankShard, Span, TensorParallelError, plan_shards
from tandem.engine.parallel.shard_mla import shard_mla
from tandem.engine.quant.gguf_blocks import Blocks

GGUF_GROUP = 32  # values per Q4_0/Q4_1/Q8_0 block, and per int4 group
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}

# module name -> what it keeps: output rows (column-parallel) or an input column span
Cuts = dict[str, list[Span] | Span]


def rank_shard(arch: ModelArch, world: int, rank: int, group: int | None,
               expert_parallel: bool = False) -> RankShard:
    """This rank's shard of ``arch``, every row-parallel split on a multiple of ``group``
    (None: any column); ``expert_parallel``: whole routed experts per rank (a dense model
    has none: then no-op). TensorParallelError when the model does not split."""
    moe = arch.moe
    # MLA: o_proj's input per head is v_head_dim; the latent cache is one replicated head
    head_dim = arch.head_dim if arch.mla is None else arch.mla.v_head_dim
    # a MoE model whose every layer is sparse has no dense MLP to split: its config's
    # intermediate_size must not refuse a split
    all_sparse = moe is not None and len(moe.sparse_layers) == arch.num_layers
    plan = plan_shards(world, num_heads=arch.num_heads, num_kv_heads=arch.num_kv_heads,
                       head_dim=head_dim,
                       intermediate_size=0 if all_sparse else arch.intermediate_size,
                       group=group,
                       expert_intermediate_size=None if moe is None else
                       moe.expert_intermediate_size,
                       shared_intermediate_size=0 if moe is None else
                       moe.shared_intermediate_size,
                       mla=arch.mla is not None,
                       num_experts=0 if moe is None else moe.num_experts,
                       expert_parallel=expert_parallel)
    return plan.rank(rank)


def local_arch(arch: ModelArch, shard: RankShard) -> ModelArch:
    """The arch as one rank sees it: its heads, KV heads and MLP widths (the KV cache, the
    runner and the activation budget are sized by it). MLA keeps its config's KV heads equal
    to its query heads (its cache is the latent, whole on every rank: ``kv_shape``). Under
    expert parallelism the routed experts keep their whole width (the router, whole, still
    picks among all of them)."""
    moe = arch.moe
    if moe is not None:
        width = moe.expert_intermediate_size
        moe = dataclasses.replace(
            moe, expert_intermediate_size=width if shard.experts is not None else
            shard.split(width).size,
            shared_intermediate_size=shard.split(moe.shared_intermediate_size).size)
    kv_heads = shard.kv_heads.size if arch.mla is None else shard.q_heads.size
    return dataclasses.replace(arch, num_heads=shard.q_heads.size, num_kv_heads=kv_heads,
                               intermediate_size=shard.intermediate.size, moe=moe)


def shard_model(model: CausalLM, shard: RankShard) -> Cuts:
    """Keep only ``shard``'s rows and columns of every decoder layer's linears, in place;
    returns what was kept of each (by module name), for :func:`shard_blocks`."""
    cuts: Cuts = {}
    for i, layer in enumerate(model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        if not isinstance(attn, Attention | MlaAttention) or not isinstance(mlp,
                                                                           MLP | SparseMoE):
            raise TensorParallelError(f"{type(attn).__name__}/{type(mlp).__name__} layers "
                                      "have no tensor-parallel split")
        p = f"layers.{i}."
        if isinstance(attn, MlaAttention):  # query heads split, the latent whole
            shard_mla(attn, shard, p + "self_attn.", cuts)
        else:
            _shard_attention(attn, shard, p + "self_attn.", cuts)
        if isinstance(mlp, MLP):
            _shard_mlp(mlp, shard, p + "mlp.", cuts)
            continue
        if shard.experts is not None:  # expert parallel: the held experts stay whole
            if mlp.experts.held != range(shard.experts.start, shard.experts.stop):
                raise TensorParallelError(f"{p}mlp holds experts {mlp.experts.held}, rank "
                                          f"{shard.rank}'s are {shard.experts}")
        else:
            for e, expert in enumerate(mlp.experts):
                _shard_mlp(expert, shard, f"{p}mlp.experts.{e}.", cuts)
        if mlp.shared_expert is not None:
            _shard_mlp(mlp.shared_expert, shard, p + "mlp.shared_expert.", cuts)
    return cuts


def _shard_attention(attn: Attention, shard: RankShard, prefix: str, cuts: Cuts) -> None:
    """Cut one grouped-query attention to ``shard``'s Q heads and their KV heads."""
    cuts[prefix + "qkv_proj"], cuts[prefix + "o_proj"] = shard.qkv_rows(), shard.o_cols()
    attn.qkv_proj = cut_rows(attn.qkv_proj, shard.qkv_rows(), prefix + "qkv_proj")
    attn.o_proj = cut_cols(attn.o_proj, shard.o_cols(), shard.adds_bias, prefix + "o_proj")
    attn.nh, attn.nkv = shard.q_heads.size, shard.kv_heads.size
    attn.q_size, attn.kv_size = attn.nh * attn.hd, attn.nkv * attn.hd


def _shard_mlp(mlp: nn.Module, shard: RankShard, prefix: str, cuts: Cuts) -> None:
    """Cut one gated MLP (a dense layer's, an expert, a shared expert) at its own width."""
    assert isinstance(mlp, MLP)
    rows, cols = shard.gate_up_rows(mlp.inter), shard.down_cols(mlp.inter)
    cuts[prefix + "gate_up_proj"], cuts[prefix + "down_proj"] = rows, cols
    mlp.gate_up_proj = cut_rows(mlp.gate_up_proj, rows, prefix + "gate_up_proj")
    mlp.down_proj = cut_cols(mlp.down_proj, cols, shard.adds_bias, prefix + "down_proj")
    mlp.inter = cols.size


def shard_blocks(stored: dict[str, Blocks], cuts: Cuts) -> dict[str, Blocks]:
    """A GGUF's stored blocks (``read_blocks``) cut as :func:`shard_model` cut the layers
    (its ``cuts``); the embedding and lm_head stay whole."""
    out: dict[str, Blocks] = {}
    for name, b in stored.items():
        cut = cuts.get(name)
        if isinstance(cut, list):
            b = Blocks(b.type, np.ascontiguousarray(b.rows[span_index(cut)]))
        elif isinstance(cut, Span):
            b = Blocks(b.type, _block_cols(b, cut))
        out[name] = b
    return out


def reduce_row_parallel(model: CausalLM) -> None:
    """Sum every row-parallel layer's partial output over the group (after quantization has
    built the layers this wraps): o_proj and a dense MLP's down_proj each, a mixture-of-
    experts block's whole output once (its experts' and shared expert's partials summed
    locally first)."""
    for layer in model.layers:
        layer.self_attn.o_proj = AllReduce(layer.self_attn.o_proj)
        if isinstance(layer.mlp, SparseMoE):
            layer.mlp = AllReduce(layer.mlp)
        else:
            layer.mlp.down_proj = AllReduce(layer.mlp.down_proj)


def _block_cols(b: Blocks, cols: Span) -> np.ndarray:
    """Columns ``cols`` of a block-quantized matrix: whole blocks, so a byte range per row."""
    if cols.start % GGUF_GROUP or cols.stop % GGUF_GROUP:  # plan_shards refused it already
        raise TensorParallelError(f"columns {cols.start}..{cols.stop} cut a block of "
                                  f"{GGUF_GROUP}")
    per = _BLOCK_BYTES[b.type]
    return np.ascontiguousarray(
        b.rows[:, cols.start // GGUF_GROUP * per : cols.stop // GGUF_GROUP * per])
