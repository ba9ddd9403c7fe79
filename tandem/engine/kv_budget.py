"""How many KV blocks fit a device when the pool is sized as a share of its memory
(``--gpu-memory-utilization``, vLLM's flag and meaning: the fraction of the whole device this
engine may hold, weights, activations and KV cache together).

With the weights already on the device::

    budget = utilization x total - (total - free) - activation reserve
    blocks = budget // bytes per block

``total - free`` counts everything the device holds now (this engine's weights, a draft
model's, other processes, the CUDA context), as vLLM counts it: the draft model is loaded
before the pool is sized (tandem/engine/spec/build.py ``load_draft``). A draft's own KV
cache has the target's blocks (the same block ids), so each block costs its bytes too.

A tensor-parallel group has one pool (rank 0's scheduler hands out the same block ids on
every rank), so it gets the fewest blocks any rank fits: each rank's figures are read after
it loaded its shard, and rank 0's blocks also cost the draft's KV (a draft runs whole on
rank 0, its weights in rank 0's memory in use)::

    group blocks = min over ranks r of blocks(rank r's free and total,
                                              per block + (draft KV per block if r == 0))
 The activation reserve is an estimate of a
step's peak beside weights and KV, not a profiled figure: every step-sized activation a
layer keeps at once, for the step's token budget, the fp32 logits of a full batch twice
(logits and the sampler's working copy), and a fixed margin for the allocator, CUDA graphs
and library workspaces. Per token, in the model's dtype: the attention's hidden state,
residual, normed input and q/k/v (an MLA model's as decompressed for prefill, with its
latent), and the wider feed-forward of the model's layers, its dense MLP or its MoE layer
(tandem/common/ffn_activations.py counts both: router logits and scores, the (token, expert)
slot buffers, one expert's intermediate over every token, the shared expert).
Torch-free: the engine passes it torch's figures (``mem_info``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from tandem.common.ffn_activations import gated_mlp_bytes, moe_layer_bytes
from tandem.engine.config import EngineConfig
from tandem.engine.models.arch import MoeArch

log = logging.getLogger(__name__)

MARGIN_BYTES = 512 * 2**20  # allocator slack, CUDA graph pools, cuBLAS/Triton workspaces


class _Shape(Protocol):
    hidden_size: int
    intermediate_size: int
    attention_width: int  # q, k and v values per token (ModelArch.attention_width)
    vocab_size: int
    moe: MoeArch | None  # None: every layer's MLP is dense


def moe_bytes(moe: MoeArch, hidden: int, act_bytes: int) -> int:
    """Bytes per token of one of ``moe``'s layers (tandem/common/ffn_activations.py)."""
    return moe_layer_bytes(hidden, moe.num_experts, moe.top_k, moe.expert_intermediate_size,
                           act_bytes, shared_width=moe.shared_intermediate_size,
                           shared_gate=moe.shared_expert_gate,
                           fp32_router=moe.routing != "softmax")  # DeepSeek's score in fp32


def feed_forward_bytes(arch: _Shape, act_bytes: int) -> int:
    """Bytes per token of the widest feed-forward among the model's layers: the dense MLP,
    or a MoE layer's (a model may have both: ``MoeArch.sparse_layers``)."""
    dense = gated_mlp_bytes(arch.intermediate_size, arch.hidden_size, act_bytes)
    if arch.moe is None:
        return dense
    return max(dense, moe_bytes(arch.moe, arch.hidden_size, act_bytes))


def activation_reserve(arch: _Shape, max_num_batched_tokens: int, max_num_seqs: int,
                       act_bytes: int) -> int:
    """Bytes kept free for one step's activations (see the module docstring)."""
    attention = act_bytes * (3 * arch.hidden_size + arch.attention_width)
    per_token = attention + feed_forward_bytes(arch, act_bytes)
    logits = 2 * max_num_seqs * arch.vocab_size * 4
    return max_num_batched_tokens * per_token + logits + MARGIN_BYTES


def blocks_for_utilization(utilization: float, total: int, free: int, reserve: int,
                           per_block: int) -> int:
    """KV blocks that fit ``utilization`` of a device of ``total`` bytes with ``free`` left
    now; raises ValueError (saying what it would take) when not even one does."""
    in_use = total - free
    budget = utilization * total - in_use - reserve
    if budget < per_block:
        gib = 2**30
        raise ValueError(
            f"--gpu-memory-utilization {utilization:g} leaves no room for the KV cache: "
            f"{utilization:g} x {total / gib:.1f} GiB = {utilization * total / gib:.2f} GiB, "
            f"{in_use / gib:.2f} GiB already in use on the device (weights, other processes), "
            f"{reserve / gib:.2f} GiB reserved for activations; raise it, or lower "
            "--max-num-batched-tokens / --max-num-seqs")
    return int(budget // per_block)


def group_blocks(utilization: float, ranks: Sequence[tuple[int, int]], reserve: int,
                 per_block: int, draft_per_block: int = 0) -> int:
    """KV blocks for the ranks whose devices have ``ranks`` (free, total) bytes, rank 0's
    first (one entry: one process): the fewest any rank fits, rank 0's blocks costing
    ``draft_per_block`` more (see the module docstring). Raises ValueError as
    ``blocks_for_utilization``, naming the rank in a group."""
    fits = []
    for rank, (free, total) in enumerate(ranks):
        cost = per_block + (draft_per_block if rank == 0 else 0)
        try:
            fits.append(blocks_for_utilization(utilization, total, free, reserve, cost))
        except ValueError as err:
            if len(ranks) == 1:
                raise
            raise ValueError(f"tensor-parallel rank {rank}: {err}") from None
    return min(fits)


def pool_blocks(config: EngineConfig, arch: _Shape, per_block: int, act_bytes: int,
                mem_info: Callable[[], Sequence[tuple[int, int]]],
                draft_per_block: int = 0) -> int:
    """The KV pool's blocks when ``num_blocks`` is not set: from ``gpu_memory_utilization``
    when given (``mem_info()`` -> each rank's device's (free, total) bytes, rank 0's first,
    asked only then; ``draft_per_block``: a draft model's KV bytes per block, on rank 0),
    else from ``kv_cache_memory_gb`` (the target's KV alone)."""
    cc = config.cache
    if cc.gpu_memory_utilization is None:
        return max(1, int(cc.kv_cache_memory_gb * 2**30) // per_block)
    ranks = mem_info()
    reserve = activation_reserve(arch, config.scheduler.max_num_batched_tokens,
                                 config.scheduler.max_num_seqs, act_bytes)
    blocks = group_blocks(cc.gpu_memory_utilization, ranks, reserve, per_block,
                          draft_per_block)
    draft = (f", and {blocks * draft_per_block / 2**30:.2f} GiB of draft KV on rank 0"
             if draft_per_block else "")
    log.info("KV cache: %d blocks (%.2f GiB a rank%s) in %.2f of %.1f GiB", blocks,
             blocks * per_block / 2**30, draft, cc.gpu_memory_utilization,
             ranks[0][1] / 2**30)
    return blocks
