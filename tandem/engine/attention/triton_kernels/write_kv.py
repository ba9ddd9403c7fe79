"""Scatter the step's new K/V rows into their paged-cache slots.

One program per new token copies its ``[Hkv, D]`` key and value into slot ``slot_mapping[t]``
(block ``slot // block_size``, offset ``slot % block_size``). A negative slot marks a padded
row (e.g. a CUDA-graph batch padded to its captured size) and writes nothing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tandem.engine.attention.triton_kernels.common import head_block


@triton.jit
def _write_kv_kernel(
    key_ptr,  # [T, Hkv, D]
    value_ptr,  # [T, Hkv, D]
    k_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    v_cache_ptr,
    slot_ptr,  # [T] int64
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_cs,
    stride_ch,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:  # a negative slot marks a padded row
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        mask = (offs_h[:, None] < NUM_HEADS) & (offs_d[None, :] < HEAD_DIM)
        src_k = t.to(tl.int64) * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :]
        src_v = t.to(tl.int64) * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :]
        dst_base = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs
        dst = dst_base + offs_h[:, None] * stride_ch + offs_d[None, :]  # [BLOCK_H, BLOCK_D]
        k = tl.load(key_ptr + src_k, mask=mask, other=0.0)
        v = tl.load(value_ptr + src_v, mask=mask, other=0.0)
        # tl.store casts to the cache dtype (e.g. fp32 activations into a bf16 cache).
        tl.store(k_cache_ptr + dst, k, mask=mask)
        tl.store(v_cache_ptr + dst, v, mask=mask)


def write_kv(
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    slot_mapping: torch.Tensor,  # [T] int64, negative = skip
) -> None:
    """Write each token's K/V into its cache slot; grid is ``(T,)``, no host sync."""
    num_tokens, num_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    if key.stride(-1) != 1 or value.stride(-1) != 1 or k_cache.stride(-1) != 1:
        raise ValueError("key, value and caches must be contiguous along the head dim")
    if k_cache.stride() != v_cache.stride():
        raise ValueError("k_cache and v_cache must share strides")
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        NUM_HEADS=num_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_heads),
        BLOCK_D=head_block(head_dim),
        BLOCK_SIZE=k_cache.shape[1],
    )
