"""The attention backend over a quantized paged KV cache: quantize on write, dequantize on read.

A quantized cache (int8 values + a scale per head vector: kv_int8.py; e4m3 values over
per-tensor scales: kv_fp8.py) stores K and V in one byte an element, which no attention
kernel reads. ``QuantizedKVBackend`` wraps any attention backend (torch, or Triton on CUDA):

    write_kv  the step's new K/V [T, Hkv, D] -> codec.quantize -> scattered into their slots
    attend    the blocks the step's tables name, [B, W] -> gathered [B * W] in table order
              -> codec.dequantize -> a compact float cache the wrapped backend attends over
              with renumbered tables (row b's w-th block is block b * W + w)

so a step dequantizes only the blocks it reads, never the whole cache. What differs between
the caches is the codec, one for K and one for V (``KVCodec``): how one tensor's values are
stored as bytes and read back.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import torch

from tandem.engine.attention.base import AttentionBackend, AttentionMetadata
from tandem.engine.platform import cpu_emulates_bf16


class KVCodec(Protocol):
    """How one cache tensor (K or V) stores its values: one byte an element."""

    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., D]`` float -> ``[..., D']`` as the cache stores it."""
        ...

    def dequantize(self, q: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``[..., D']`` as stored -> ``[..., D]`` in ``dtype``."""
        ...


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """``t`` as uint8, same shape: torch's index_copy_ has no float8 kernel on the CPU."""
    return t.view(torch.uint8)


class QuantizedKVBackend:
    """An attention backend over a quantized cache, delegating the attention math to
    ``inner``; ``name`` is ``inner``'s plus ``+<tag>`` (``torch+int8kv``)."""

    def __init__(self, inner: AttentionBackend, tag: str, k: KVCodec, v: KVCodec) -> None:
        self.inner = inner
        self.name = f"{inner.name}+{tag}"
        self.k_codec, self.v_codec = k, v

    def for_layer(self, layer: int) -> QuantizedKVBackend:
        """Layer ``layer``'s backend: this one, its codecs every layer's (Fp8KVBackend's
        per-layer scales give each layer its own)."""
        return self

    def write_kv(
        self,
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D'] one byte an element
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,  # [T] int64
    ) -> None:
        """Quantize the step's new K/V and scatter them into their slots."""
        flat_k = _bytes(k_cache).view(-1, k_cache.shape[-2], k_cache.shape[-1])
        flat_v = _bytes(v_cache).view(-1, v_cache.shape[-2], v_cache.shape[-1])
        flat_k.index_copy_(0, slot_mapping, _bytes(self.k_codec.quantize(key)))
        flat_v.index_copy_(0, slot_mapping, _bytes(self.v_codec.quantize(value)))

    def attend(
        self,
        query: torch.Tensor,  # [T, Hq, D]
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:
        """Dequantize the step's blocks (``[B * W]`` of them, table order) and attend (through
        a sliding ``window`` when set)."""
        b, w = meta.block_tables.shape
        # a block freed behind a sliding window is -1 and never read: dequantize block 0 there
        flat = meta.block_tables.reshape(-1).long().clamp(min=0)
        # bf16 attention on a CPU without bf16 math runs in fp32 anyway: skip a round trip.
        dtype = torch.float32 if cpu_emulates_bf16(query) else query.dtype
        k = self.k_codec.dequantize(k_cache.index_select(0, flat), dtype)  # [B*W, bs, Hkv, D]
        v = self.v_codec.dequantize(v_cache.index_select(0, flat), dtype)
        tables = torch.arange(b * w, dtype=torch.int32, device=flat.device).view(b, w)
        local = dataclasses.replace(meta, block_tables=tables)
        return self.inner.attend(query, k, v, local, scale, window).to(query.dtype)
