"""Paged prefill attention: query tiles of each chunk over the sequence's paged context.

Grid ``(num_q_tiles, Hkv)``. A program takes ``BLOCK_Q`` consecutive tokens of one chunk and
all ``G = Hq / Hkv`` query heads of one kv head, flattened into ``BLOCK_M = BLOCK_Q * G`` rows
(row r = token r // G, head r % G), so each K/V tile is loaded once for the whole group:

    rows:   t0h0 t0h1 t0h2 t1h0 t1h1 t1h2 ... | pad      (G = 3, BLOCK_M = 64 -> BLOCK_Q = 21)

Token i of a chunk of length ql in a sequence of length L sits at position ``L - ql + i`` and
sees keys 0 .. that position, so the program visits keys up to its last token's position and
masks causally inside the last tiles. In a sliding-window layer (window W) it starts at the
tile holding its first token's window start, ``position - W + 1``, loads nothing before that
and masks each row's older keys. The (sequence, first token) of each query tile comes from
a small map built from the host lists ``query_lens_cpu``; no device value is read on the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tandem.engine.attention.base import AttentionMetadata
from tandem.engine.attention.triton_kernels.common import (
    LOG2E,
    attend_kv_tiles,
    check_paged_inputs,
    dot_in_fp32,
    head_block,
)
from tandem.engine.attention.triton_kernels.decode import tile_tokens

BLOCK_ROWS = 128  # query rows (tokens x heads of a group) per program


@triton.jit
def _prefill_kernel(
    q_ptr,  # [T, Hq, D]
    k_ptr,  # [num_blocks, block_size, Hkv, D]
    v_ptr,
    table_ptr,  # [B, max_blocks] int32
    seq_lens_ptr,  # [B] int32
    query_start_ptr,  # [B + 1] int32
    tile_map_ptr,  # [num_q_tiles, 2] int32: (sequence, first token within its chunk)
    out_ptr,  # [T, Hq, D]
    qk_scale,
    window,  # SLIDING: keys a row sees, itself included
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
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    DOT_FP32: tl.constexpr,
    SLIDING: tl.constexpr,
):
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    b = tl.load(tile_map_ptr + 2 * tile)
    tok0 = tl.load(tile_map_ptr + 2 * tile + 1)
    q_start = tl.load(query_start_ptr + b)
    q_len = tl.load(query_start_ptr + b + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + b)
    cached = seq_len - q_len  # positions already in the cache before this chunk

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    tok = tok0 + offs_m // GROUP  # [BLOCK_M] token within the chunk
    heads = kvh * GROUP + offs_m % GROUP  # [BLOCK_M] query head
    m_mask = (offs_m < BLOCK_Q * GROUP) & (tok < q_len)
    d_mask = offs_d < HEAD_DIM
    row_mask = m_mask[:, None] & d_mask[None, :]
    rows = (q_start + tok).to(tl.int64)
    q_off = rows[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr + q_off, mask=row_mask, other=0.0)  # [BLOCK_M, BLOCK_D]
    if DOT_FP32:
        q = q.to(tl.float32)

    key_hi = tl.minimum(seq_len, cached + tok0 + BLOCK_Q)  # past the tile's last token
    key_min = 0
    if SLIDING:  # the window start of the tile's first token
        key_min = tl.maximum(cached + tok0 - window + 1, 0)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - 1.0e30
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc, m_i, l_i = attend_kv_tiles(
        acc, m_i, l_i, q, cached + tok,
        k_ptr + kvh * stride_head, v_ptr + kvh * stride_head,
        table_ptr + b.to(tl.int64) * stride_table,
        (key_min // TILE_N) * TILE_N, key_hi, key_min, window, qk_scale, stride_blk,
        stride_slot, offs_d, d_mask, BLOCK_SIZE, TILE_N, DOT_FP32, SLIDING,
    )  # fmt: skip
    o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    o_off = rows[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(out_ptr + o_off, o, mask=row_mask)


def prefill_tile_map(meta: AttentionMetadata, block_q: int, device: torch.device) -> torch.Tensor:
    """``[num_q_tiles, 2]`` int32 (sequence, first token) of every prefill query tile.

    Built from the host lists. Tiles that see the most keys come first, so the longest programs
    start first and the short ones fill in behind them.
    """
    nd = meta.num_decodes
    work: list[tuple[int, int, int]] = []  # (keys seen by the tile's last row, seq, start)
    for b in range(nd, meta.num_seqs):
        q_len, seq_len = meta.query_lens_cpu[b], meta.seq_lens_cpu[b]
        for start in range(0, q_len, block_q):
            work.append((seq_len - q_len + min(start + block_q, q_len), b, start))
    work.sort(reverse=True)
    host = torch.tensor([(b, start) for _, b, start in work], dtype=torch.int32).reshape(-1, 2)
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def paged_prefill(
    query: torch.Tensor,  # [T, Hq, D], rows of all sequences (decode rows are skipped)
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    out: torch.Tensor,  # [T, Hq, D]
    scale: float,
    window: int | None = None,
) -> None:
    """Causal attention of the prefill chunks (sequences ``num_decodes..B-1``) into ``out``,
    each row over its last ``window`` positions when that is set."""
    check_paged_inputs(query, k_cache, v_cache)
    num_q_heads, head_dim = query.shape[1], query.shape[2]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    block_m = max(BLOCK_ROWS, triton.next_power_of_2(group))
    block_q = block_m // group
    tile_map = prefill_tile_map(meta, block_q, query.device)
    if tile_map.shape[0] == 0:
        return
    block_d = head_block(head_dim)
    _prefill_kernel[(tile_map.shape[0], num_kv_heads)](
        query, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc,
        tile_map, out, scale * LOG2E, window or 0,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        meta.block_tables.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_Q=block_q, BLOCK_D=block_d,
        BLOCK_SIZE=block_size, TILE_N=tile_tokens(block_size),
        DOT_FP32=dot_in_fp32(query.dtype, k_cache.dtype), SLIDING=bool(window),
        num_warps=8 if block_d >= 128 else 4, num_stages=2,
    )  # fmt: skip
