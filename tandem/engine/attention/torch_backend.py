"""Reference attention in plain torch: gathers blocks and calls scaled_dot_product_attention.

It runs on any device. Decode rows of all sequences are attended in one padded SDPA call (a
boolean mask hides the padding); each prefill chunk gets its own call, causal with an offset
for the positions that were already cached. In a sliding-window layer each sequence's keys are
gathered from the first block its first query row sees (blocks before it may be freed), and
the mask also hides the keys older than each row's window.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tandem.engine.attention.base import AttentionMetadata
from tandem.engine.platform import cpu_emulates_bf16


class TorchAttentionBackend:
    """Paged attention built from torch ops; the correctness reference for other backends."""

    name = "torch"

    def for_layer(self, layer: int) -> TorchAttentionBackend:
        """Every layer's backend: this one (its cache has no per-layer scales)."""
        return self

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
        window: int | None = None,
    ) -> torch.Tensor:
        """Attention of every query row over its sequence's context (its last ``window``
        positions, with one), decodes batched."""
        out = torch.empty_like(query)
        nd = meta.num_decodes
        if nd:
            if window:
                out[:nd] = self._decode_window(query[:nd], k_cache, v_cache, meta, scale, window)
            else:
                out[:nd] = self._decode(query[:nd], k_cache, v_cache, meta, scale)
        starts = meta.query_start_loc.tolist() if meta.num_seqs > nd else []
        for b in range(nd, meta.num_seqs):
            qs, qe = starts[b], starts[b + 1]
            if window:
                out[qs:qe] = self._prefill_window(query[qs:qe], k_cache, v_cache, meta, b, scale,
                                                  window)
            else:
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

    def _decode_window(
        self,
        query: torch.Tensor,  # [nd, Hq, D]
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int,
    ) -> torch.Tensor:
        # Row b (position seq_len - 1) sees positions lo_b = seq_len - window .. seq_len - 1;
        # its keys are gathered from block lo_b // bs on, nblocks of them for every row.
        nd = query.shape[0]
        bs = meta.block_size
        lens = meta.seq_lens_cpu[:nd]
        lo = [max(0, n - window) for n in lens]
        first = [x // bs for x in lo]
        nblocks = max(-(-n // bs) - f for n, f in zip(lens, first, strict=True))
        dev = query.device
        cols = torch.tensor(first, device=dev)[:, None] + torch.arange(nblocks, device=dev)
        cols = cols.clamp(max=meta.block_tables.shape[1] - 1)  # past the end: masked below
        table = meta.block_tables[:nd].gather(1, cols)  # [nd, nblocks]
        k = k_cache[table].flatten(1, 2).transpose(1, 2)  # [nd, Hkv, nblocks * bs, D]
        v = v_cache[table].flatten(1, 2).transpose(1, 2)
        positions = (torch.tensor(first, device=dev)[:, None] * bs
                     + torch.arange(nblocks * bs, device=dev))  # [nd, L] absolute
        mask = ((positions < meta.seq_lens[:nd, None])
                & (positions >= torch.tensor(lo, device=dev)[:, None]))
        o = _sdpa(query.unsqueeze(2), k, v, mask[:, None, None, :], scale)  # [nd, Hq, 1, D]
        return o.squeeze(2)

    def _prefill_window(
        self,
        query: torch.Tensor,  # [ql, Hq, D]
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        b: int,
        scale: float,
        window: int,
    ) -> torch.Tensor:
        bs = meta.block_size
        ql = query.shape[0]
        sl = meta.seq_lens_cpu[b]
        ctx = sl - ql
        # the chunk's first row (position ctx) sees ctx - window + 1 on: gather from its block
        first = max(0, ctx - window + 1) // bs
        base = first * bs
        table = meta.block_tables[b, first : (sl + bs - 1) // bs]
        k = k_cache[table].flatten(0, 1)[: sl - base].transpose(0, 1).unsqueeze(0)
        v = v_cache[table].flatten(0, 1)[: sl - base].transpose(0, 1).unsqueeze(0)
        q = query.transpose(0, 1).unsqueeze(0)  # [1, Hq, ql, D]
        # Row i (position ctx + i) sees keys ctx + i - window + 1 .. ctx + i.
        rows = torch.arange(ql, device=query.device)[:, None] + ctx
        cols = torch.arange(sl - base, device=query.device)[None, :] + base
        mask = (cols <= rows) & (cols > rows - window)
        o = _sdpa(q, k, v, mask[None, None], scale)
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
