"""The fp8 paged KV cache: float8 e4m3 values over one per-tensor scale for K and one for V.

Each cached element is one byte, ``x ~= float(q) * scale``, ``q = e4m3(clamp(x / scale,
-448, 448))``; the cache stays one tensor ``[L, 2, num_blocks, block_size, Hkv, D]`` of
``torch.float8_e4m3fn``, half the bytes of a 16-bit cache (and of a 16-bit cache's push):

    k_cache[..., d] = e4m3(k[..., d] / k_scale)      v_cache[..., d] = e4m3(v[..., d] / v_scale)

Scales are per tensor, as vLLM's and SGLang's ``k_scale``/``v_scale``: a property of the
cache, fixed when it is made, not of a block. So blocks need no scales beside them (the prefix
cache, copy-on-write and the KV transfer move bytes only), a block written by one worker reads
the same on a peer whose scales are equal, and the transfer layout names the scales
(``Fp8Scales.layout``) so peers whose scales differ are refused at HELLO. Without calibrated
scales from a checkpoint (its ``k_scale``/``v_scale``, folded per tensor:
tandem/engine/quant/kv_scales.py) both are 1.0, vLLM's default too: e4m3 keeps a relative precision of
2^-4 over [2^-6, 448] whatever the scale, so a scale only moves where values fall off either
end. SmolLM2's K and V stay under 20 in magnitude and mostly above 2^-6 (but layer 0's V, 43%
below it), and scales calibrated per layer (amax / 448 of each layer's K and V over the same
text) measured no better than 1.0 on its perplexity (21.254 against 21.227, float16 KV 20.919,
1,024 tokens of tests/data/ppl_text.txt): the loss is e4m3's 3-bit mantissa, not its range.
A value past 448 * scale saturates (torch's cast would make it NaN).

``Fp8KVBackend`` wraps any attention backend (torch, or Triton on CUDA): kv_backend.py's
QuantizedKVBackend, as the int8 cache's, with a codec each for K and V over their scales; it
quantizes on write and, per step, dequantizes only the blocks named in the step's block
tables into a compact float cache the wrapped backend attends over. The fused native CPU
forward (tandem/engine/native) serves the same cache without it: the runner gives it these
scales, its kernels write the bytes quantize_fp8 writes for the same K/V and read each byte
widened in registers (kv_head.h, e4m3.h).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from tandem.engine.attention.base import AttentionBackend
from tandem.engine.quant.kv_backend import QuantizedKVBackend

log = logging.getLogger(__name__)

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3fn value
# The spellings --kv-cache-dtype takes for this cache (vLLM's two), and the one it refuses.
FP8_NAMES = ("fp8", "fp8_e4m3")
FP8_E5M2 = "fp8_e5m2"


@dataclass(frozen=True, slots=True)
class Fp8Scales:
    """The per-tensor scales of an fp8 cache: ``x = float(q) * scale``."""

    k: float = 1.0
    v: float = 1.0

    def __post_init__(self) -> None:
        for name in ("k", "v"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"fp8 KV {name}_scale must be finite and > 0, got {value}")

    @property
    def layout(self) -> str:
        """How the transfer layout names them: equal strings only for equal scales."""
        return f"per-tensor k={self.k!r} v={self.v!r}"


def fp8_scales(model: object) -> Fp8Scales:
    """The fp8 cache's scales for ``model``: its checkpoint's calibrated ones folded per
    tensor (``model.kv_scales``, tandem/engine/quant/kv_scales.py), else 1.0 each."""
    calibrated = getattr(model, "kv_scales", None)
    if calibrated is None:
        return Fp8Scales()
    k, v = calibrated.folded()
    log.info("fp8 KV cache: the checkpoint's scales, k=%g v=%g (the largest of its layers')",
             k, v)
    return Fp8Scales(k, v)


def quantize_fp8(x: torch.Tensor, scale: float) -> torch.Tensor:  # [...] float -> [...] e4m3
    """``x / scale`` saturated to e4m3's range, rounded to nearest even."""
    return (x.float() / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize_fp8(q: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """``[...]`` e4m3 -> ``[...]`` in ``dtype``."""
    return (q.float() * scale).to(dtype)


@dataclass(frozen=True, slots=True)
class Fp8Codec:
    """One fp8 cache tensor's codec (K's or V's): e4m3 over its per-tensor ``scale``."""

    scale: float

    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., D]`` float -> ``[..., D]`` e4m3 (quantize_fp8)."""
        return quantize_fp8(x, self.scale)

    def dequantize(self, q: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``[..., D]`` e4m3 -> ``[..., D]`` in ``dtype`` (dequantize_fp8)."""
        return dequantize_fp8(q, self.scale, dtype)


class Fp8KVBackend(QuantizedKVBackend):
    """An attention backend over an fp8 cache, delegating the attention math to ``inner``."""

    def __init__(self, inner: AttentionBackend, scales: Fp8Scales) -> None:
        super().__init__(inner, "fp8kv", Fp8Codec(scales.k), Fp8Codec(scales.v))
        self.scales = scales
