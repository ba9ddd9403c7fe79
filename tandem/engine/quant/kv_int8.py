"""The int8 paged KV cache: int8 values with one fp32 scale per head vector, in place.

Each cached head vector (one token, one KV head: ``D`` values) is stored as ``D + 4`` bytes:

    [ q_0 q_1 ... q_{D-1} | scale (fp32, 4 bytes) ]     x ~= q * scale, scale = max|x| / 127

so the cache stays one tensor ``[L, 2, num_blocks, block_size, Hkv, D + 4]`` of int8 and a
block carries its own scales: reading, shipping and writing blocks (prefix cache, the transfer
layer) needs no second tensor. A scale per 64-value vector, fixed when the token is written,
suits a cache that grows a token at a time (a per-block scale would need rescaling as the
block fills). For D = 64: 68 bytes instead of 128 (bf16) or 256 (fp32).

``Int8KVBackend`` wraps any attention backend: it quantizes on write and, per step,
dequantizes only the blocks named in the step's block tables into a compact float cache that
the wrapped backend attends over with renumbered tables.
"""

from __future__ import annotations

import dataclasses

import torch

from tandem.engine.attention.base import AttentionBackend, AttentionMetadata
from tandem.engine.platform import cpu_emulates_bf16

SCALE_BYTES = 4  # one fp32 scale after each head vector


def storage_head_dim(head_dim: int, kv_cache_dtype: str) -> int:
    """Last dimension of the cache tensor: ``head_dim`` (+ the scale's bytes for int8)."""
    return head_dim + SCALE_BYTES if kv_cache_dtype == "int8" else head_dim


def quantize_heads(x: torch.Tensor) -> torch.Tensor:  # [..., D] float -> [..., D + 4] int8
    """Symmetric int8 per head vector, the fp32 scale appended as 4 raw bytes."""
    xf = x.float()
    scale = (xf.abs().amax(dim=-1, keepdim=True) / 127).clamp(min=1e-12)  # [..., 1]
    q = torch.round(xf / scale).clamp(-127, 127).to(torch.int8)
    return torch.cat([q, scale.view(torch.int8)], dim=-1)


def dequantize_heads(packed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[..., D + 4]`` int8 -> ``[..., D]`` in ``dtype``."""
    d = packed.shape[-1] - SCALE_BYTES
    scale = packed[..., d:].view(torch.float32)  # [..., 1]
    return (packed[..., :d].float() * scale).to(dtype)


class Int8KVBackend:
    """An attention backend over an int8 cache, delegating the attention math to ``inner``."""

    def __init__(self, inner: AttentionBackend) -> None:
        self.inner = inner
        self.name = f"{inner.name}+int8kv"

    def write_kv(
        self,
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D + 4] int8
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,  # [T] int64
    ) -> None:
        """Quantize the step's new K/V and scatter them into their slots."""
        flat_k = k_cache.view(-1, k_cache.shape[-2], k_cache.shape[-1])
        flat_v = v_cache.view(-1, v_cache.shape[-2], v_cache.shape[-1])
        flat_k.index_copy_(0, slot_mapping, quantize_heads(key))
        flat_v.index_copy_(0, slot_mapping, quantize_heads(value))

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
        k = dequantize_heads(k_cache.index_select(0, flat), dtype)  # [B*W, bs, Hkv, D]
        v = dequantize_heads(v_cache.index_select(0, flat), dtype)
        tables = torch.arange(b * w, dtype=torch.int32, device=flat.device).view(b, w)
        local = dataclasses.replace(meta, block_tables=tables)
        return self.inner.attend(query, k, v, local, scale, window).to(query.dtype)
