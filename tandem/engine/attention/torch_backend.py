"""Reference attention in plain torch: gathers blocks and calls scaled_dot_product_attention.

It runs on any device. Decode rows of all sequences are attended in one padded SDPA call (a
boolean mask hides the padding); each prefill chunk gets its own call, causal with an offset
for the positions that were already cached.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tandem.engine.attention.base import AttentionMetadata
from tandem.engine.platform import cpu_emulates_bf16


class TorchAttentionBackend:
    """Paged attention built from torch ops; the correctness reference for other backends."""

    name = "torch"

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Scatter new K/V rows into their slots: cache viewed as [num_blocks * bs, Hkv, D]."""
        flat_k = k_cache.view(-1, k_cache.shape[-2], k_cache.shape[-1])
        flat_v = v_cache.view(-1, v_cache.shape[-2], v_cache.shape[-1])
        flat_k.index_copy_(0, slot_mapping, key.to(k_cache.dtype))
        flat_v.index_copy_(0, slot_mapping, value.to(v_cache.dtype))

    def attend(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """Attention of every query row over its sequence's context, decodes batched."""
        out = torch.empty_like(query)
        nd = meta.num_decodes
        if nd:
            out[:nd] = self._decode(query[:nd], k_cache, v_cache, meta, scale)
        starts = meta.query_start_loc.tolist() if meta.num_seqs > nd else []
        for b in range(nd, meta.num_seqs):
            qs, qe = starts[b], starts[b + 1]
            out[qs:qe] = self._prefill_one(query[qs:qe], k_cache, v_cache, meta, b, scale)
        return out

    def _decode(
        self,
        query: torch.Tensor,  # [nd, Hq, D]
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        nd = query.shape[0]
        bs = meta.block_size
        max_len = max(meta.seq_lens_cpu[:nd])
        nblocks = (max_len + bs - 1) // bs
        table = meta.block_tables[:nd, :nblocks]  # [nd, nblocks]
        # [nd, nblocks, bs, Hkv, D] -> [nd, Hkv, L, D]
        k = k_cache[table].flatten(1, 2)[:, :max_len].transpose(1, 2)
        v = v_cache[table].flatten(1, 2)[:, :max_len].transpose(1, 2)
        positions = torch.arange(max_len, device=query.device)
        mask = positions[None, :] < meta.seq_lens[:nd, None]  # [nd, L]
        q = query.unsqueeze(2)  # [nd, Hq, 1, D]
        o = _sdpa(q, k, v, mask[:, None, None, :], scale)  # [nd, Hq, 1, D]
        return o.squeeze(2)

    def _prefill_one(
        self,
        query: torch.Tensor,  # [ql, Hq, D]
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        b: int,
        scale: float,
    ) -> torch.Tensor:
        bs = meta.block_size
        ql = query.shape[0]
        sl = meta.seq_lens_cpu[b]
        table = meta.block_tables[b, : (sl + bs - 1) // bs]
        k = k_cache[table].flatten(0, 1)[:sl].transpose(0, 1).unsqueeze(0)  # [1, Hkv, sl, D]
        v = v_cache[table].flatten(0, 1)[:sl].transpose(0, 1).unsqueeze(0)
        q = query.transpose(0, 1).unsqueeze(0)  # [1, Hq, ql, D]
        ctx = sl - ql
        if ctx == 0:
            o = _sdpa(q, k, v, None, scale, causal=True)
        else:
            # Row i (absolute position ctx + i) sees keys 0 .. ctx + i.
            rows = torch.arange(ql, device=query.device)[:, None] + ctx
            cols = torch.arange(sl, device=query.device)[None, :]
            o = _sdpa(q, k, v, (cols <= rows)[None, None], scale)
        return o[0].transpose(0, 1)  # [ql, Hq, D]


def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    causal: bool = False,
) -> torch.Tensor:
    """SDPA with grouped-query heads handled natively (no repeated K/V copies); bf16 on a CPU
    without bf16 arithmetic runs in fp32 (3x faster there, and no less exact)."""
    gqa = q.shape[1] != k.shape[1]
    dtype = q.dtype
    if k.dtype != dtype:  # a cache stored narrower than the model computes (fp16 KV, fp32 model)
        k, v = k.to(dtype), v.to(dtype)
    if cpu_emulates_bf16(q):
        q, k, v = q.float(), k.float(), v.float()
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa
    )
    return out.to(dtype)
