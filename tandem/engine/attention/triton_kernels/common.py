"""Helpers shared by the paged attention kernels: the online-softmax loop over K/V tiles.

A key tile is ``TILE_N`` consecutive positions made of whole cache blocks, so every position
finds its physical slot through one block-table entry:

    position p  ->  block_tables[b, p // BLOCK_SIZE] * stride_blk + (p % BLOCK_SIZE) * stride_slot

Query rows of a program are any ``M`` rows that share one kv head (GQA: the query heads of one
group, times the tokens of a query tile), so each K/V tile is loaded once for all of them.

In a sliding-window layer (``SLIDING``, window W) a row at position p keeps keys p - W + 1 .. p,
and no position before ``key_min`` (the window start of the program's first row) is loaded at
all: the blocks before it may have been freed and handed to another sequence.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

LOG2E = math.log2(math.e)


# Read once, like ``triton.jit`` does when it decorates the kernels of this package.
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def is_interpreting() -> bool:
    """True when this package's kernels run in Triton's numpy interpreter (``TRITON_INTERPRET``
    was set before they were imported); they then take CPU tensors."""
    return _INTERPRETED


def dot_in_fp32(query_dtype: torch.dtype, cache_dtype: torch.dtype) -> bool:
    """Whether the kernels upcast Q/K/V to fp32 before ``tl.dot``.

    fp32 or mixed-dtype inputs always do (IEEE dot, no TF32). On a GPU fp16/bf16 dots run on
    tensor cores with fp32 accumulation. The interpreter stores bf16 as raw uint16 and its
    ``tl.dot`` is a plain numpy matmul, so there bf16 is upcast too (fp16 keeps the GPU path).
    """
    mixed = query_dtype != cache_dtype
    bf16_interp = query_dtype == torch.bfloat16 and is_interpreting()
    return mixed or query_dtype == torch.float32 or bf16_interp


def head_block(head_dim: int) -> int:
    """Padded head dim for ``tl.arange``: a power of two, at least 16 (``tl.dot``'s minimum)."""
    return max(16, triton.next_power_of_2(head_dim))


def check_paged_inputs(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Validate layouts the kernels assume: unit stride on D, K and V caches laid out alike."""
    if k_cache.stride() != v_cache.stride() or k_cache.shape != v_cache.shape:
        raise ValueError("k_cache and v_cache must share shape and strides")
    if query.stride(-1) != 1 or k_cache.stride(-1) != 1:
        raise ValueError("query and caches must be contiguous along the head dim")
    block_size = k_cache.shape[1]
    if block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    if query.shape[1] % k_cache.shape[2]:
        raise ValueError(f"{query.shape[1]} query heads not divisible by {k_cache.shape[2]}")


@triton.jit
def attend_kv_tiles(
    acc,  # [M, BLOCK_D] fp32 running numerator
    m_i,  # [M] fp32 running max of the log2-scaled scores
    l_i,  # [M] fp32 running denominator
    q,  # [M, BLOCK_D] query rows of one kv head
    q_pos,  # [M] int32 absolute position of each query row (causal limit)
    k_ptr,  # K cache base, already offset to the kv head
    v_ptr,  # V cache base, already offset to the kv head
    table_ptr,  # this sequence's block-table row
    key_lo,  # first key position to visit, a multiple of TILE_N
    key_hi,  # one past the last key position to visit
    key_min,  # positions before it are not loaded (sliding window; 0 otherwise)
    window,  # SLIDING: keys a row sees, itself included
    qk_scale,  # softmax scale * log2(e): exp2 instead of exp
    stride_blk,
    stride_slot,
    offs_d,  # [BLOCK_D]
    d_mask,  # [BLOCK_D] real head-dim lanes
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    DOT_FP32: tl.constexpr,
    SLIDING: tl.constexpr,
):
    """Fold keys [max(key_lo, key_min), key_hi) into (acc, m_i, l_i) with online softmax."""
    offs_n = tl.arange(0, TILE_N)
    for start in range(key_lo, key_hi, TILE_N):
        pos = start + offs_n  # [TILE_N]
        n_mask = (pos < key_hi) & (pos >= key_min)
        blk = tl.load(table_ptr + pos // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        slot = blk * stride_blk + (pos % BLOCK_SIZE) * stride_slot  # [TILE_N]
        kv_off = slot[:, None] + offs_d[None, :]  # [TILE_N, BLOCK_D]
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + kv_off, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + kv_off, mask=kv_mask, other=0.0)
        if DOT_FP32:
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))  # [M, TILE_N] fp32
        keep = n_mask[None, :] & (pos[None, :] <= q_pos[:, None])
        if SLIDING:
            keep = keep & (pos[None, :] > q_pos[:, None] - window)
        s = tl.where(keep, s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: m_i starts at -1e30
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])  # [M, TILE_N], 0 where masked
        l_i = l_i * alpha + tl.sum(p, 1)
        if DOT_FP32:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return acc, m_i, l_i
