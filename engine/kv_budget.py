"""How many KV blocks fit a device when the pool is sized as a share of its memory
(``--gpu-memory-utilization``, vLLM's flag and meaning: the fraction of the whole device this
engine may hold, weights, activations and KV cache together).

With the weights already on the device::

    budget = utilization x total - (total - free) - activation reserve
    blocks = budget // bytes per block

``total - free`` counts everything the device holds now (this engine's weights, other
processes, the CUDA context), as vLLM counts it. The activation reserve is an estimate of a
step's peak beside weights and KV, not a profiled figure: every step-sized activation a
layer keeps at once (hidden state, residual, normed input, q/k/v, gate, up and their product)
for the step's token budget, the fp32 logits of a full batch twice (logits and the sampler's
working copy), and a fixed margin for the allocator, CUDA graphs and library workspaces.
Torch-free: the engine passes it torch's figures.
"""

from __future__ import annotations

from typing import Protocol

MARGIN_BYTES = 512 * 2**20  # allocator slack, CUDA graph pools, cuBLAS/Triton workspaces


class _Shape(Protocol):
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int


def activation_reserve(arch: _Shape, max_num_batched_tokens: int, max_num_seqs: int,
                       act_bytes: int) -> int:
    """Bytes kept free for one step's activations (see the module docstring)."""
    qkv = (arch.num_heads + 2 * arch.num_kv_heads) * arch.head_dim
    per_token = act_bytes * (3 * arch.hidden_size + qkv + 3 * arch.intermediate_size)
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
