"""Paged decode attention: one query row per sequence, split-KV (flash-decoding) when useful.

Grid ``(num_decodes, Hkv, num_splits)``. A program loads the ``G = Hq / Hkv`` query heads of
one kv head (padded to 16 rows for ``tl.dot``) and walks its share of the context in tiles of
whole blocks, so each K/V tile is read once for the whole group:

    context of seq b:  | tile | tile | tile | tile | tile | tile | ... |
    split 0:           |<-- tiles_per_split -->|
    split 1:                                   |<-- tiles_per_split -->|

With one split the kernel writes the output directly. With more, each split writes its partial
output and log-sum-exp, and ``_decode_reduce_kernel`` merges them. The grid and
``tiles_per_split`` depend only on the batch size and the ``max_blocks`` bound, never on the
sequence lengths, so the launch can be captured in a CUDA graph; splits past a sequence's end
exit with an empty partial (lse = -inf). In a sliding-window layer the splits cover the window
only: tiles start at the one holding ``seq_len - window`` (and the grid needs no more tiles than
a window spans).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tandem.engine.attention.triton_kernels.common import (
    LOG2E,
    attend_kv_tiles,
    check_paged_inputs,
    dot_in_fp32,
    head_block,
)

TILE_TOKENS = 64  # key positions per tile (rounded up to one block when blocks are bigger)
PROGRAMS_PER_SM = 4  # split until about this many programs per SM are in flight
MAX_SPLITS = 64


@triton.jit
def _decode_kernel(
    q_ptr,  # [nd, Hq, D]
    k_ptr,  # [num_blocks, block_size, Hkv, D]
    v_ptr,
    table_ptr,  # [nd, max_blocks] int32
    seq_lens_ptr,  # [nd] int32
    out_ptr,  # [nd, Hq, D]                   (not SPLIT_KV)
    part_out_ptr,  # [nd, Hq, splits, D] fp32    (SPLIT_KV; splits = grid dim 2)
    part_lse_ptr,  # [nd, Hq, splits] fp32, log2 units
    qk_scale,
    tiles_per_split,
    window,  # SLIDING: keys the row sees, itself included
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_table,
    stride_blk,
    stride_slot,
    stride_head,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    SPLIT_KV: tl.constexpr,
    DOT_FP32: tl.constexpr,
    SLIDING: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_g  # [BLOCK_G] query heads of this kv head
    row_mask = g_mask[:, None] & d_mask[None, :]
    q_off = b.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr + q_off, mask=row_mask, other=0.0)  # [BLOCK_G, BLOCK_D]
    if DOT_FP32:
        q = q.to(tl.float32)
    key_min = 0
    if SLIDING:
        key_min = tl.maximum(seq_len - window, 0)
    key_lo = (key_min // TILE_N) * TILE_N + split * tiles_per_split * TILE_N
    key_hi = tl.minimum(key_lo + tiles_per_split * TILE_N, seq_len)
    q_pos = tl.zeros([BLOCK_G], dtype=tl.int32) + (seq_len - 1)  # sees the whole context
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    m_i = tl.zeros([BLOCK_G], dtype=tl.float32) - 1.0e30
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc, m_i, l_i = attend_kv_tiles(
        acc, m_i, l_i, q, q_pos,
        k_ptr + kvh * stride_head, v_ptr + kvh * stride_head,
        table_ptr + b.to(tl.int64) * stride_table,
        key_lo, key_hi, key_min, window, qk_scale, stride_blk, stride_slot, offs_d, d_mask,
        BLOCK_SIZE, TILE_N, DOT_FP32, SLIDING,
    )  # fmt: skip
    has_keys = l_i > 0.0
    o = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    if not SPLIT_KV:
        o_off = b.to(tl.int64) * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(out_ptr + o_off, o, mask=row_mask)
    else:
        row = (b * (GROUP * tl.num_programs(1)) + heads).to(tl.int64) * tl.num_programs(2) + split
        tl.store(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], o, mask=row_mask)
        lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + row, lse, mask=g_mask)


@triton.jit
def _decode_reduce_kernel(
    part_out_ptr,  # [nd, Hq, num_splits, D] fp32
    part_lse_ptr,  # [nd, Hq, num_splits] fp32
    out_ptr,  # [nd, Hq, D]
    num_splits,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < num_splits
    d_mask = offs_d < HEAD_DIM
    row = (b * tl.num_programs(1) + h).to(tl.int64) * num_splits + offs_s  # [BLOCK_S]
    lse = tl.load(part_lse_ptr + row, mask=s_mask, other=float("-inf"))
    # split 0 always has keys (a window starts inside its first tile), so the max is finite
    w = tl.exp2(lse - tl.max(lse, 0))
    parts = tl.load(
        part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :],
        mask=s_mask[:, None] & d_mask[None, :],
        other=0.0,
    )  # [BLOCK_S, BLOCK_D]
    o = tl.sum(parts * w[:, None], 0) / tl.sum(w, 0)
    o_off = b.to(tl.int64) * stride_ot + h * stride_oh + offs_d
    tl.store(out_ptr + o_off, o, mask=d_mask)


def decode_splits(num_decodes: int, num_kv_heads: int, num_tiles: int, num_sms: int) -> int:
    """Splits per sequence so that about ``PROGRAMS_PER_SM * num_sms`` programs run."""
    base = num_decodes * num_kv_heads
    return max(1, min(num_tiles, MAX_SPLITS, triton.cdiv(PROGRAMS_PER_SM * num_sms, base)))


def tile_tokens(block_size: int) -> int:
    """Key positions per tile: whole blocks, at least ``TILE_TOKENS``."""
    return max(block_size, TILE_TOKENS)


def decode_tiles(max_blocks: int, block_size: int, window: int | None) -> int:
    """Key tiles a decode row visits at most: the context bound's, or a window's."""
    tile_n = tile_tokens(block_size)
    tiles = triton.cdiv(max_blocks * block_size, tile_n)
    if window:  # [seq_len - window, seq_len) from the tile holding its start
        tiles = min(tiles, triton.cdiv(window + tile_n - 1, tile_n))
    return tiles


def paged_decode(
    query: torch.Tensor,  # [nd, Hq, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [nd, >= max_blocks] int32
    seq_lens: torch.Tensor,  # [nd] int32, every entry in [1, max_blocks * block_size]
    out: torch.Tensor,  # [nd, Hq, D]
    scale: float,
    max_blocks: int,
    num_splits: int,
    window: int | None = None,
) -> None:
    """Decode attention of one query row per sequence into ``out`` (over its last ``window``
    positions, with one); grid fixed by shapes."""
    check_paged_inputs(query, k_cache, v_cache)
    nd, num_q_heads, head_dim = query.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    if nd == 0:
        return
    group = num_q_heads // num_kv_heads
    tile_n = tile_tokens(block_size)
    num_tiles = decode_tiles(max_blocks, block_size, window)
    tiles_per_split = triton.cdiv(num_tiles, num_splits)
    num_splits = triton.cdiv(num_tiles, tiles_per_split)  # drop splits that would be empty
    part_out = part_lse = out  # placeholders, unused with one split
    if num_splits > 1:
        part_out = query.new_empty((nd, num_q_heads, num_splits, head_dim), dtype=torch.float32)
        part_lse = query.new_empty((nd, num_q_heads, num_splits), dtype=torch.float32)
    block_d = head_block(head_dim)
    _decode_kernel[(nd, num_kv_heads, num_splits)](
        query, k_cache, v_cache, block_tables, seq_lens, out, part_out, part_lse,
        scale * LOG2E, tiles_per_split, window or 0,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        block_tables.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_D=block_d, BLOCK_SIZE=block_size, TILE_N=tile_n, SPLIT_KV=num_splits > 1,
        DOT_FP32=dot_in_fp32(query.dtype, k_cache.dtype), SLIDING=bool(window),
        num_warps=4, num_stages=2,
    )  # fmt: skip
    if num_splits > 1:
        _decode_reduce_kernel[(nd, num_q_heads)](
            part_out, part_lse, out, num_splits, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, BLOCK_D=block_d,
            BLOCK_S=triton.next_power_of_2(num_splits), num_warps=4,
        )  # fmt: skip
