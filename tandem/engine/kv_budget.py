"""How many KV blocks fit a device when the pool is sized as a share of its memory
(``--gpu-memory-utilization``, vLLM's flag and meaning: the fraction of the whole device this
engine may hold, weights, activations and KV cache together).

With the weights already on the device::

    budget = utilization x total - (total - free) - activation reserve
    blocks = budget // bytes per block

``total - free`` counts everything the device holds now (this engine's weights, other
processes, the CUDA context), as vLLM counts it. The activation reserve is an estimate of a
step's peak beside weights and KV, not a profiled figure: every step-sized activation a
layer keeps at once, for the step's token budget, the fp32 logits of a full batch twice
(logits and the sampler's working copy), and a fixed margin for the allocator, CUDA graphs
and library workspaces. Per token, in the model's dtype unless marked fp32::

    attention     hidden state, residual, normed input; q/k/v (an MLA model's as
                  decompressed for prefill, with its latent)
    + the larger feed-forward of the model's layers:
    dense MLP     gate and up (2 I), act(gate), their product (I each): 4 I
    MoE layer     router logits (fp32 for DeepSeek's routers, with the input in fp32) and
                  three fp32 working copies (scores, corrected choice, its mask), E each;
                  top-k weights and ids; per (token, expert) slot (k a token): the gathered
                  input and the expert's output (hidden each), that output in fp32 and
                  weighted (hidden each, fp32), three int64 indices (sort order, token,
                  sort scratch); one expert's gated MLP at a time (4 I_e, and its hidden-
                  wide output), over at most every token of the step (a token picks an
                  expert once); the summed output; a shared expert's MLP, output and gate

The experts run one after another (tandem/engine/models/layers/moe_experts.py), so one
expert's intermediate is live at a time, but an expert may take every token of the step.
Torch-free: the engine passes it torch's figures (``mem_info``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

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


FP32, INDEX = 4, 8  # bytes of an fp32 value, of an int64 index


def gated_mlp_bytes(width: int, hidden: int, act_bytes: int) -> int:
    """Bytes per row of one gated MLP's activations: gate and up, act(gate), their
    product, and its output."""
    return act_bytes * (4 * width + hidden)


def moe_layer_bytes(moe: MoeArch, hidden: int, act_bytes: int) -> int:
    """Bytes per token of a mixture-of-experts layer's activations (the module docstring's
    MoE row)."""
    e, k = moe.num_experts, moe.top_k
    fp32_router = moe.routing != "softmax"  # DeepSeek's routers score in fp32
    router = (e * (FP32 if fp32_router else act_bytes) + 3 * e * FP32 + k * (FP32 + INDEX)
              + (hidden * FP32 if fp32_router else 0))
    slots = k * (2 * hidden * act_bytes + 2 * hidden * FP32 + 3 * INDEX)
    expert = gated_mlp_bytes(moe.expert_intermediate_size, hidden, act_bytes)
    summed = hidden * act_bytes
    shared = 0
    if moe.shared_intermediate_size:
        shared = gated_mlp_bytes(moe.shared_intermediate_size, hidden, act_bytes)
        if moe.shared_expert_gate:
            shared += act_bytes * (1 + hidden)  # the gate and the gated output
    return router + slots + expert + summed + shared


def feed_forward_bytes(arch: _Shape, act_bytes: int) -> int:
    """Bytes per token of the widest feed-forward among the model's layers: the dense MLP,
    or a MoE layer's (a model may have both: ``MoeArch.sparse_layers``)."""
    dense = gated_mlp_bytes(arch.intermediate_size, arch.hidden_size, act_bytes)
    if arch.moe is None:
        return dense
    return max(dense, moe_layer_bytes(arch.moe, arch.hidden_size, act_bytes))


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


def pool_blocks(config: EngineConfig, arch: _Shape, per_block: int, act_bytes: int,
                mem_info: Callable[[], tuple[int, int]]) -> int:
    """The KV pool's blocks when ``num_blocks`` is not set: from ``gpu_memory_utilization``
    when given (``mem_info()`` -> the device's (free, total) bytes, asked only then), else
    from ``kv_cache_memory_gb``."""
    cc = config.cache
    if cc.gpu_memory_utilization is None:
        return max(1, int(cc.kv_cache_memory_gb * 2**30) // per_block)
    free, total = mem_info()
    reserve = activation_reserve(arch, config.scheduler.max_num_batched_tokens,
                                 config.scheduler.max_num_seqs, act_bytes)
    blocks = blocks_for_utilization(cc.gpu_memory_utilization, total, free, reserve, per_block)
    log.info("KV cache: %d blocks (%.2f GiB) in %.2f of %.1f GiB", blocks,
             blocks * per_block / 2**30, cc.gpu_memory_utilization, total / 2**30)
    return blocks
