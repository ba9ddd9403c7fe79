"""The fp8 paged KV cache: float8 e4m3 values over a scale for K and one for V in each layer.

Each cached element is one byte, ``x ~= float(q) * scale``, ``q = e4m3(clamp(x / scale,
-448, 448))``; the cache stays one tensor ``[L, 2, num_blocks, block_size, Hkv, D]`` of
``torch.float8_e4m3fn``, half the bytes of a 16-bit cache (and of a 16-bit cache's push):

    layer l:   k_cache[..., d] = e4m3(k[..., d] / k_scale[l])
               v_cache[..., d] = e4m3(v[..., d] / v_scale[l])

Scales are per tensor and layer, as vLLM's and SGLang's ``k_scale``/``v_scale``: a property
of the cache, fixed when it is made, not of a block. So blocks need no scales beside them (the
prefix cache, copy-on-write and the KV transfer move bytes only), a block written by one
worker reads the same on a peer whose scales are equal, and the transfer layout names the
scales (``Fp8Scales.layout``) so peers whose scales differ are refused at HELLO. A
checkpoint's calibrated ``k_scale``/``v_scale`` (tandem/engine/quant/kv_scales.py) are one K
and one V scale per layer: each layer's blocks are written and read under its own. Without
them both are 1.0 for every layer, vLLM's default too: e4m3 keeps a relative precision of
2^-4 over [2^-6, 448] whatever the scale, so a scale only moves where values fall off either
end. SmolLM2's K and V stay under 20 in magnitude and mostly above 2^-6 (but layer 0's V, 43%
below it), and scales calibrated per layer (amax / 448 of each layer's K and V over the same
text) measured no better than 1.0 on its perplexity (21.254 against 21.227, float16 KV 20.919,
1,024 tokens of tests/data/ppl_text.txt): the loss is e4m3's 3-bit mantissa, not its range.
A value past 448 * scale saturates (torch's cast would make it NaN).

``Fp8KVBackend`` wraps any attention backend (torch, or Triton on CUDA): kv_backend.py's
QuantizedKVBackend, as the int8 cache's, with a codec each for K and V over a layer's scales
(``for_layer``); it quantizes on write and, per step, dequantizes only the blocks named in the
step's block tables into a compact float cache the wrapped backend attends over. The fused native CPU
forward (tandem/engine/native) serves the same cache without it: the runner gives it these
scales, its kernels write the bytes quantize_fp8 writes for the same K/V and read each byte
widened in registers (kv_head.h, e4m3.h).
"""

from __future__ import annotations

import hashlib
import logging
import math
import struct
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
# The longest per-layer scales Fp8Scales.layout lists value by value (a digest past it).
LAYOUT_LISTED = 512


@dataclass(frozen=True, slots=True)
class Fp8Scales:
    """The scales of an fp8 cache, ``x = float(q) * scale``: one K and one V scale for every
    layer (1-tuples, per tensor) or one per layer (``k[l]``, ``v[l]``, as a checkpoint
    calibrates them). A float given for ``k`` or ``v`` is one scale for every layer, and
    per-layer values that are all equal become that one scale: equal scales compare and name
    (``layout``) equal however they were given."""

    k: tuple[float, ...] = (1.0,)
    v: tuple[float, ...] = (1.0,)

    def __post_init__(self) -> None:
        for name in ("k", "v"):
            given = getattr(self, name)
            values = ((float(given),) if isinstance(given, int | float)
                      else tuple(float(x) for x in given))
            if not values:
                raise ValueError(f"fp8 KV {name}_scale: no values")
            for value in values:
                if not (math.isfinite(value) and value > 0):
                    raise ValueError(f"fp8 KV {name}_scale must be finite and > 0, got {value}")
            object.__setattr__(self, name, values[:1] if len(set(values)) == 1 else values)
        if len(self.k) > 1 and len(self.v) > 1 and len(self.k) != len(self.v):
            raise ValueError(f"fp8 KV scales for {len(self.k)} layers of K and {len(self.v)} "
                             "of V")

    @property
    def per_layer(self) -> bool:
        """Whether some layers' scales differ."""
        return len(self.k) > 1 or len(self.v) > 1

    def layer(self, i: int) -> tuple[float, float]:
        """Layer ``i``'s (k, v)."""
        return self.k[i if len(self.k) > 1 else 0], self.v[i if len(self.v) > 1 else 0]

    def for_layers(self, n: int) -> list[tuple[float, float]]:
        """Every layer's (k, v) for a model of ``n`` layers; ValueError when per-layer scales
        count other layers."""
        counts = {len(t) for t in (self.k, self.v) if len(t) > 1}
        if counts and counts != {n}:
            raise ValueError(f"fp8 KV scales for {counts.pop()} layers, the model has {n}")
        return [self.layer(i) for i in range(n)]

    @property
    def layout(self) -> str:
        """How the transfer layout names them: equal strings only for equal scales. Per-layer
        scales are listed while that stays short (``LAYOUT_LISTED`` characters), else named
        by their range and a digest of every value: the string travels in the KV transfer's
        HELLO, whose strings a peer bounds (4 KiB by default)."""
        if not self.per_layer:
            return f"per-tensor k={self.k[0]!r} v={self.v[0]!r}"
        listed = f"per-layer k={list(self.k)!r} v={list(self.v)!r}"
        if len(listed) <= LAYOUT_LISTED:
            return listed
        raw = struct.pack(f"<2q{len(self.k)}d{len(self.v)}d", len(self.k), len(self.v),
                          *self.k, *self.v)
        return (f"per-layer k=[{min(self.k)!r}..{max(self.k)!r}] "
                f"v=[{min(self.v)!r}..{max(self.v)!r}] "
                f"sha256={hashlib.sha256(raw).hexdigest()[:32]}")


def fp8_scales(model: object) -> Fp8Scales:
    """The fp8 cache's scales for ``model``: its checkpoint's calibrated ones, one K and one V
    per layer (``model.kv_scales``, tandem/engine/quant/kv_scales.py), else 1.0 each."""
    calibrated = getattr(model, "kv_scales", None)
    if calibrated is None:
        return Fp8Scales()
    scales = Fp8Scales(calibrated.k, calibrated.v)
    log.info("fp8 KV cache: the checkpoint's scales, %s", scales.layout)
    return scales


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
    """An attention backend over an fp8 cache, delegating the attention math to ``inner``;
    each layer runs through ``for_layer(l)``, under its own scales (the backend's own codecs
    are layer 0's)."""

    def __init__(self, inner: AttentionBackend, scales: Fp8Scales) -> None:
        k, v = scales.layer(0)
        super().__init__(inner, "fp8kv", Fp8Codec(k), Fp8Codec(v))
        self.scales = scales
        self._layers: dict[int, QuantizedKVBackend] = {}

    def for_layer(self, layer: int) -> QuantizedKVBackend:
        """The backend of layer ``layer``: this one under per-tensor scales, else one over
        that layer's K and V codecs."""
        if not self.scales.per_layer:
            return self
        view = self._layers.get(layer)
        if view is None:
            k, v = self.scales.layer(layer)
            view = self._layers[layer] = QuantizedKVBackend(self.inner, "fp8kv", Fp8Codec(k),
                                                            Fp8Codec(v))
        return view
