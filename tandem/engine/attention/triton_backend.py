"""Paged attention in Triton: the GPU backend, checked on CPU under ``TRITON_INTERPRET=1``.

Three kernels (``tandem/engine/attention/triton_kernels``), one step:

    write_kv   new K/V rows -> their cache slots                      grid (T,)
    decode     rows 0 .. num_decodes-1, split-KV over the context     grid (nd, Hkv, splits)
    prefill    the prefill chunks, query tiles x causal key tiles     grid (q_tiles, Hkv)

Every program handles all query heads of one kv head (GQA), accumulates in fp32 and reads keys
through ``meta.block_tables``. Grids are sized from tensor shapes and the host lists of the
metadata, never from device values, so a step does no host sync; the decode grid depends only
on the batch size and a max-blocks bound, so ``decode`` can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton

from tandem.engine.attention.base import AttentionMetadata
from tandem.engine.attention.triton_kernels.decode import decode_splits, decode_tiles, paged_decode
from tandem.engine.attention.triton_kernels.prefill import paged_prefill
from tandem.engine.attention.triton_kernels.write_kv import write_kv as _write_kv


class TritonAttentionBackend:
    """Paged attention with Triton kernels; matches ``TorchAttentionBackend`` numerically."""

    name = "triton"

    def __init__(self, decode_splits: int | None = None) -> None:
        """``decode_splits`` fixes the split-KV factor of decode; None picks it per batch."""
        self._decode_splits = decode_splits
        self._num_sms: dict[int, int] = {}

    def for_layer(self, layer: int) -> TritonAttentionBackend:
        """Every layer's backend: this one (its cache has no per-layer scales)."""
        return self

    def write_kv(
        self,
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,  # [T, Hkv, D]
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        v_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        slot_mapping: torch.Tensor,  # [T] int64, negative = padded row, skipped
    ) -> None:
        """Scatter the step's new keys and values into their cache slots."""
        _write_kv(key, value, k_cache, v_cache, slot_mapping)

    def attend(
        self,
        query: torch.Tensor,  # [T, Hq, D]
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:  # [T, Hq, D]
        """Causal attention of every query row over its sequence's cached keys (GQA aware);
        with ``window``, over the last ``window`` positions up to its own."""
        out = torch.empty_like(query)
        nd = meta.num_decodes
        if nd:
            bs = meta.block_size
            max_blocks = meta.max_decode_blocks or triton.cdiv(max(meta.seq_lens_cpu[:nd]), bs)
            self.decode(
                query[:nd], k_cache, v_cache, meta.block_tables[:nd], meta.seq_lens[:nd],
                scale, max_blocks, out=out[:nd], window=window,
            )  # fmt: skip
        if meta.num_seqs > nd:
            paged_prefill(query, k_cache, v_cache, meta, out, scale, window)
        return out

    def decode(
        self,
        query: torch.Tensor,  # [nd, Hq, D]
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,  # [nd, >= max_blocks] int32
        seq_lens: torch.Tensor,  # [nd] int32, each <= max_blocks * block_size
        scale: float,
        max_blocks: int,
        out: torch.Tensor | None = None,  # [nd, Hq, D]
        window: int | None = None,
    ) -> torch.Tensor:
        """Decode attention only, with the context bound given by the caller (and a sliding
        ``window``, when set).

        The launch depends on ``nd``, ``max_blocks`` and ``window`` alone, so a CUDA-graph
        runner captures it once per batch size with ``max_blocks`` = the block-table width.
        """
        out = torch.empty_like(query) if out is None else out
        num_tiles = decode_tiles(max_blocks, k_cache.shape[1], window)
        splits = self._decode_splits
        if splits is None:
            sms = self._sm_count(query.device)
            splits = decode_splits(query.shape[0], k_cache.shape[2], num_tiles, sms)
        paged_decode(
            query, k_cache, v_cache, block_tables, seq_lens, out, scale, max_blocks, splits,
            window,
        )
        return out

    def _sm_count(self, device: torch.device) -> int:
        """Streaming multiprocessors of ``device`` (1 off CUDA: no split unless forced)."""
        if device.type != "cuda":
            return 1
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self._num_sms:
            self._num_sms[index] = torch.cuda.get_device_properties(index).multi_processor_count
        return self._num_sms[index]
