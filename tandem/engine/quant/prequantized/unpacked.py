"""Quantized weights unpacked into our convention, and the layers built from them.

    Int4Weight   w[n, k] = (q[n, k] - 8) * scale[n, k // g] + zero[n, k // g]   -> Int4Linear
    Int8Weight   w[n, k] = q[n, k] * scale[n]                                   -> Int8Linear
    Fp8Weight    w[n, k] = e4m3(q[n, k]) * scale[rows[n], k // block_k]         -> PackedLinear
                                                          (kind 7, the native CPU kernels)

Each format's reader (awq.py, gptq.py, compressed_tensors.py, fp8.py) returns one of these per
checkpoint linear; a fused layer (q/k/v, gate/up) is the row concatenation of its parts, each
part keeping its own groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from tandem.engine.errors import ModelLoadError
from tandem.engine.quant.int4 import Int4Linear
from tandem.engine.quant.int8 import Int8Linear


@dataclass(frozen=True, slots=True)
class Int4Weight:
    """Grouped int4 weights in ``Int4Linear``'s convention."""

    q: torch.Tensor  # [N, K] uint8, values 0..15
    scale: torch.Tensor  # [N, K / group_size] fp32
    zero: torch.Tensor  # [N, K / group_size] fp32
    group_size: int

    @classmethod
    def from_zero_points(
        cls,
        q: torch.Tensor,  # [N, K] integer, 0..15
        zero_point: torch.Tensor,  # [N, K / g] integer (GPTQ v1 reaches 16)
        scale: torch.Tensor,  # [N, K / g] float
        group_size: int,
    ) -> Int4Weight:
        """From the formats' ``w = (q - zero_point) * scale``: ``zero = (8 - zero_point) * scale``.

        Exact in fp32 for fp16/bf16 scales: ``(8 - zp) * s`` and ``(q - 8) * s`` need at most
        4 + 11 significant bits each, and so does their sum ``(q - zp) * s``."""
        s = scale.float()
        w = cls(
            q.to(torch.uint8).contiguous(),
            s.contiguous(),
            ((8 - zero_point.float()) * s).contiguous(),
            group_size,
        )
        w.check()
        return w

    def check(self) -> None:
        """Raise ModelLoadError unless the shapes agree with each other and the group size."""
        n, k = self.q.shape
        g = self.group_size
        want = (n, k // g)
        if k % g or self.scale.shape != want or self.zero.shape != want:
            raise ModelLoadError(
                f"int4 weight [{n}, {k}] with group size {g} has scales "
                f"{tuple(self.scale.shape)} and zeros {tuple(self.zero.shape)}, expected {want}"
            )

    def dequantize(self) -> torch.Tensor:  # [N, K] fp32
        """The weight these values stand for, computed as ``Int4Linear.dequantize`` does."""
        n, k = self.q.shape
        q = self.q.view(n, k // self.group_size, self.group_size).float()
        return ((q - 8) * self.scale[..., None] + self.zero[..., None]).view(n, k)


@dataclass(frozen=True, slots=True)
class Int8Weight:
    """Per-output-channel symmetric int8 weights in ``Int8Linear``'s convention."""

    q: torch.Tensor  # [N, K] int8
    scale: torch.Tensor  # [N] fp32

    def check(self) -> None:
        """Raise ModelLoadError unless there is one scale per output channel."""
        if self.q.dtype != torch.int8 or self.scale.shape != (self.q.shape[0],):
            raise ModelLoadError(
                f"int8 weight {tuple(self.q.shape)} {self.q.dtype} has scales "
                f"{tuple(self.scale.shape)}, expected int8 and ({self.q.shape[0]},)"
            )

    def dequantize(self) -> torch.Tensor:  # [N, K] fp32
        """The weight these values stand for."""
        return self.q.float() * self.scale[:, None]


@dataclass(frozen=True, slots=True)
class Fp8Weight:
    """FP8 weights as an FP8 checkpoint stores them: e4m3 bytes and a grid of block scales,
    each weight row pointing at its row of the grid (a fused layer's parts keep their own)."""

    q: torch.Tensor  # [N, K] uint8: float8_e4m3fn codes
    scale: torch.Tensor  # [R, ceil(K / block_k)] fp32
    rows: torch.Tensor  # [N] int32: the scale row of each weight row
    block_k: int  # inputs per scale (K for a per-tensor scale)

    def dequantize(self) -> torch.Tensor:  # [N, K] fp32
        """The weight these values stand for: ``e4m3 * scale`` rounded once to fp32."""
        k = self.q.shape[1]
        wide = self.scale.repeat_interleave(self.block_k, dim=1)[:, :k]
        return self.q.view(torch.float8_e4m3fn).float() * wide[self.rows.long()]


QuantizedWeight = Int4Weight | Int8Weight | Fp8Weight


def concat_rows(parts: Sequence[QuantizedWeight]) -> QuantizedWeight:
    """One fused weight from its parts (rows of the first part first)."""
    first = parts[0]
    if len(parts) == 1:
        return first
    if isinstance(first, Int4Weight):
        int4 = [p for p in parts if isinstance(p, Int4Weight)]
        if len(int4) != len(parts) or any(p.group_size != first.group_size for p in int4):
            raise ModelLoadError("the parts of a fused linear layer are quantized differently")
        return Int4Weight(
            torch.cat([p.q for p in int4]),
            torch.cat([p.scale for p in int4]),
            torch.cat([p.zero for p in int4]),
            first.group_size,
        )
    if isinstance(first, Fp8Weight):
        fp8 = [p for p in parts if isinstance(p, Fp8Weight)]
        if len(fp8) != len(parts) or len({(p.q.shape[1], p.block_k) for p in fp8}) > 1:
            raise ModelLoadError("the parts of a fused linear layer are quantized differently")
        offsets = torch.tensor([0, *(p.scale.shape[0] for p in fp8[:-1])]).cumsum(0).tolist()
        return Fp8Weight(torch.cat([p.q for p in fp8]), torch.cat([p.scale for p in fp8]),
                         torch.cat([p.rows + off for p, off in zip(fp8, offsets, strict=True)]),
                         first.block_k)
    int8 = [p for p in parts if isinstance(p, Int8Weight)]
    if len(int8) != len(parts):
        raise ModelLoadError("the parts of a fused linear layer are quantized differently")
    return Int8Weight(torch.cat([p.q for p in int8]), torch.cat([p.scale for p in int8]))


def build_linear(
    w: QuantizedWeight, bias: torch.Tensor | None, device: torch.device
) -> nn.Module:
    """The layer for ``w``, its buffers made on ``device`` (so only a CPU layer builds the
    CPU kernel's pack); FP8 weights are kept for the native CPU kernels only."""
    if isinstance(w, Fp8Weight):
        if device.type != "cpu":
            raise ModelLoadError(f"FP8 weights are kept as e4m3 on the CPU only, not {device}")
        from tandem.engine.native.packed_linear import PackedLinear

        return PackedLinear.from_fp8(w.q, w.scale, w.rows, w.block_k, bias)
    b = None if bias is None else bias.to(device)
    if isinstance(w, Int4Weight):
        return Int4Linear(
            w.q.to(device), w.scale.to(device), w.zero.to(device), b, group_size=w.group_size
        )
    return Int8Linear(w.q.to(device), w.scale.to(device), b)


def unpack_int32(
    packed: torch.Tensor, bits: int, dim: int, order: Sequence[int] | None = None
) -> torch.Tensor:
    """Split every int32 of ``packed`` into ``32 // bits`` unsigned fields along ``dim``.

    Field ``i`` (bits ``i*bits .. i*bits + bits - 1``) of word ``w`` becomes element
    ``w * (32 // bits) + order[i]`` (``order[i] = i`` by default: the layout GPTQ and
    compressed-tensors share; AWQ shuffles it). Returns uint8, ``packed``'s shape with ``dim``
    widened."""
    if packed.dtype != torch.int32:
        raise ModelLoadError(f"packed weights must be int32, not {packed.dtype}")
    per, mask = 32 // bits, (1 << bits) - 1
    p = packed.movedim(dim, -1)  # [..., W]
    out = torch.empty(*p.shape, per, dtype=torch.uint8, device=p.device)
    for i in range(per):  # the arithmetic shift of negative words is undone by the mask
        out[..., i if order is None else order[i]] = (p >> (bits * i)) & mask
    return out.flatten(-2).movedim(-1, dim).contiguous()
