"""The int8 paged KV cache: int8 values with one fp32 scale per head vector, in place.

Each cached head vector (one token, one KV head: ``D`` values) is stored as ``D + 4`` bytes:

    [ q_0 q_1 ... q_{D-1} | scale (fp32, 4 bytes) ]     x ~= q * scale, scale = max|x| / 127

so the cache stays one tensor ``[L, 2, num_blocks, block_size, Hkv, D + 4]`` of int8 and a
block carries its own scales: reading, shipping and writing blocks (prefix cache, the transfer
layer) needs no second tensor. A scale per 64-value vector, fixed when the token is written,
suits a cache that grows a token at a time (a per-block scale would need rescaling as the
block fills). For D = 64: 68 bytes instead of 128 (bf16) or 256 (fp32).

``Int8KVBackend`` wraps any attention backend (kv_backend.py's QuantizedKVBackend with this
cache's codec): it quantizes on write and, per step, dequantizes only the blocks named in the
step's block tables into a compact float cache that the wrapped backend attends over.
"""

from __future__ import annotations

import torch

from tandem.engine.attention.base import AttentionBackend
from tandem.engine.quant.kv_backend import QuantizedKVBackend

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


class Int8Codec:
    """The int8 cache's codec for K and for V alike: the scales travel in the cache."""

    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., D]`` float -> ``[..., D + 4]`` int8 (quantize_heads)."""
        return quantize_heads(x)

    def dequantize(self, q: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``[..., D + 4]`` int8 -> ``[..., D]`` in ``dtype`` (dequantize_heads)."""
        return dequantize_heads(q, dtype)


class Int8KVBackend(QuantizedKVBackend):
    """An attention backend over an int8 cache, delegating the attention math to ``inner``."""

    def __init__(self, inner: AttentionBackend) -> None:
        codec = Int8Codec()
        super().__init__(inner, "int8kv", codec, codec)
