"""Multi-head latent attention over the paged latent cache (DeepSeek-V2/V3).

An MLA layer's cache is one plane ``[num_blocks, block_size, 1, W]``, ``W = kv_lora_rank (R)
+ rope dims``: per token its normalized latent ``c`` and its rotated shared key part
``k_pe``, one "head" every query head reads. Two ways to attend over it, equal in exact
arithmetic (tandem/engine/models/layers/mla.py chooses per row):

    decompressed (prefill)  gather the context's rows, decompress every head's k_nope and v
                            through kv_b_proj, attend with keys [k_nope | k_pe] (H heads)
    absorbed (decode)       fold W_UK (kv_b_proj's key rows) into the query,
                            q_lat = q_nope W_UK [H, R]; attend with [q_lat | q_pe] over the
                            cached rows as keys *and* values (one KV head, head size W); the
                            attention-weighted latent goes out through W_UV (its value rows)

The absorbed form reads W values per cached token instead of every head's decompressed key
and value, which is what makes MLA's decode cheap. It runs through the backend's own paged
decode (torch or Triton) with one KV head: the values are the whole cached row, and the
output's rope part (a weighted sum of k_pe) is dropped.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from tandem.engine.attention.base import AttentionBackend, AttentionMetadata
from tandem.engine.platform import cpu_emulates_bf16

# cached latent rows [S, W] -> (keys [S, H, qk_head_dim], values [S, H, v_head_dim])
Decompress = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def write_latent(backend: AttentionBackend, latent: torch.Tensor, cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
    """Scatter the step's latent rows ``[T, W]`` into ``cache`` ``[num_blocks, bs, 1, W]``
    through the backend's own KV write: the latent plane is its own K and V (written twice,
    the same values), so padded rows (slot -1) are skipped as the backend skips them."""
    rows = latent[:, None, :]
    backend.write_kv(rows, rows, cache, cache, slot_mapping)


def decode_rows(meta: AttentionMetadata) -> AttentionMetadata:
    """``meta`` restricted to its decode sequences (they come first)."""
    nd = meta.num_decodes
    if nd == meta.num_seqs:
        return meta
    return AttentionMetadata(
        query_start_loc=meta.query_start_loc[: nd + 1],
        seq_lens=meta.seq_lens[:nd],
        block_tables=meta.block_tables[:nd],
        slot_mapping=meta.slot_mapping[:nd],
        query_lens_cpu=meta.query_lens_cpu[:nd],
        seq_lens_cpu=meta.seq_lens_cpu[:nd],
        num_decodes=nd,
        block_size=meta.block_size,
        max_decode_blocks=meta.max_decode_blocks,
    )


def attend_absorbed(
    backend: AttentionBackend,
    query: torch.Tensor,  # [nd, H, W]: [q_nope W_UK | q_pe] of the decode rows
    cache: torch.Tensor,  # [num_blocks, bs, 1, W]
    meta: AttentionMetadata,  # decode rows only (decode_rows)
    scale: float,
    kv_lora_rank: int,
) -> torch.Tensor:  # [nd, H, R]: the attention-weighted latent of each head
    """Absorbed decode: MQA of every head over the cached rows, keys and values alike."""
    return backend.attend(query, cache, cache, meta, scale)[..., :kv_lora_rank]


def attend_decompressed(
    query: torch.Tensor,  # [rows, H, qk_head_dim]: the rows of sequences first_seq on
    cache: torch.Tensor,  # [num_blocks, bs, 1, W]
    meta: AttentionMetadata,
    first_seq: int,
    scale: float,
    decompress: Decompress,
    v_head_dim: int,
) -> torch.Tensor:  # [rows, H, v_head_dim]
    """Causal attention of the rows of sequences ``first_seq ..`` over their whole context,
    decompressed from the cache a sequence at a time."""
    out = query.new_empty(query.shape[0], query.shape[1], v_head_dim)
    bs = meta.block_size
    at = 0
    for b in range(first_seq, meta.num_seqs):
        ql, sl = meta.query_lens_cpu[b], meta.seq_lens_cpu[b]
        table = meta.block_tables[b, : -(-sl // bs)]
        rows = cache[table].flatten(0, 1)[:sl, 0]  # [sl, W]
        k, v = decompress(rows.to(query.dtype))  # [sl, H, qk], [sl, H, vd]
        q = query[at : at + ql].transpose(0, 1)[None]  # [1, H, ql, qk]
        ctx = sl - ql
        mask = None
        if ctx:  # row i (position ctx + i) sees keys 0 .. ctx + i
            rows_pos = torch.arange(ql, device=query.device)[:, None] + ctx
            mask = (torch.arange(sl, device=query.device)[None, :] <= rows_pos)[None, None]
        o = _sdpa(q, k.transpose(0, 1)[None], v.transpose(0, 1)[None], mask, scale,
                  causal=not ctx)
        out[at : at + ql] = o[0].transpose(0, 1)
        at += ql
    return out


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
          scale: float, causal: bool) -> torch.Tensor:
    """SDPA (value width may differ from the key's); bf16 on a CPU without bf16 arithmetic in
    fp32, as the torch backend does."""
    dtype = q.dtype
    if cpu_emulates_bf16(q):
        q, k, v = q.float(), k.float(), v.float()
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
    return out.to(dtype)
