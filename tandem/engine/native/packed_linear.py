"""A linear layer stored in the native kernels' layout: the one CPU copy of its weights.

    GGUF Q4_1 / Q4_0 blocks ─┐                      q     d      m       w[n, k]
    GGUF Q8_0 blocks ────────┼─> PackedLinear   Q4: nibbles fp16  fp16    d * q + m
    Int4Linear (any group) ──┤   (kind, q, d, m) Q8: int8    fp16  -       d * q   (groups of 32)
    Int8Linear ──────────────┤                  I8: int8    fp32 [N] -   d * q   (per row)
    FP8 checkpoint linears ──┘                  F8: e4m3    fp32 [R, K] int32 [N]
                                                    e4m3(q) * d[m[n], k] / 256 (fp8_weights.h)

``forward`` runs tandem/engine/native's ``tnd_linear`` for any number of rows (few-row integer loops
or the tiled fp32 path, linear_rows.h / gemm_tiled.h); the fused forward reads the same
buffers in place, so nothing is repacked or copied. ``embedding`` dequantizes table rows (a
GGUF's Q8_0 ``token_embd`` serves both the embedding and the tied lm_head). Without the native
library, ``forward`` dequantizes and multiplies with torch.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tandem.engine.native.build import load
from tandem.engine.quant.int4 import Int4Linear
from tandem.engine.quant.int8 import Int8Linear

QK = 32
KIND_Q4_F32, KIND_Q8_ROW, KIND_Q4_F16, KIND_F32, KIND_Q8_F16 = 0, 1, 2, 3, 4
# A float model's own weights, read in place (fused_forward.NativeLinear): fp32, or bf16/fp16
# rows widened to fp32 in registers (quant_linear.h kinds 5, 6); activations stay fp32.
KIND_BF16, KIND_F16 = 5, 6
# An FP8 checkpoint's e4m3 weights with their block scales (fp8_weights.h), fp32 activations.
KIND_FP8 = 7
# The kernels widen an e4m3 byte to its value times 2^-8 (through fp16): the scale rows hold
# the scales times 2^8 (exact).
FP8_SCALE_SHIFT = 256.0
FLOAT_KINDS = {torch.float32: KIND_F32, torch.bfloat16: KIND_BF16, torch.float16: KIND_F16}
_F = ctypes.POINTER(ctypes.c_float)
_U8 = ctypes.POINTER(ctypes.c_uint8)


class LinStruct(ctypes.Structure):
    """``tnd::Lin`` (quant_linear.h)."""

    _fields_ = [("kind", ctypes.c_int32), ("n", ctypes.c_int32), ("k", ctypes.c_int32),
                ("q", _U8), ("d", _F), ("m", _F), ("bias", _F)]


def _ptr(t: torch.Tensor | None, kind: type) -> object:
    return ctypes.cast(None if t is None else t.data_ptr(), kind)


def _blocks(rows: np.ndarray | torch.Tensor, nbytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GGUF block rows ``[N, G * nbytes]`` as ``[N, G, nbytes]`` uint8 (a copy: the GGUF is a
    read-only mmap) and each block's leading fp16 scale ``[N, G]``."""
    raw = torch.from_numpy(np.array(rows, dtype=np.uint8))
    b = raw.view(raw.shape[0], -1, nbytes)
    return b, b[..., 0:2].contiguous().view(torch.float16).view(raw.shape[0], -1)


def _f16_exact(t: torch.Tensor) -> bool:
    return bool(torch.equal(t.half().float(), t))


class PackedLinear(nn.Module):
    """``y = x @ W^T + bias`` with ``W`` in one of the kernels' quantized layouts."""

    def __init__(self, kind: int, n: int, k: int, q: torch.Tensor, d: torch.Tensor,
                 m: torch.Tensor | None, bias: torch.Tensor | None, fmt: str) -> None:
        super().__init__()
        if k % QK and kind != KIND_FP8:  # FP8 rows take any K (fp8_weights.h)
            raise ValueError(f"in_features {k} is not a multiple of {QK}")
        self.kind, self.out_features, self.in_features, self.format = kind, n, k, fmt
        self.register_buffer("q", q.contiguous())
        self.register_buffer("d", d.contiguous())
        self.register_buffer("m", None if m is None else m.contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())
        self._struct: LinStruct | None = None
        self._struct_ptrs: tuple[int, ...] = ()

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_q4_1(cls, blocks: np.ndarray | torch.Tensor, bias: torch.Tensor | None = None):
        """GGUF Q4_1 rows ``[N, K/32 * 20]`` (fp16 d, fp16 m, 16 bytes of nibbles per block)."""
        b, d = _blocks(blocks, 20)
        n = b.shape[0]
        m = b[..., 2:4].contiguous().view(torch.float16).view(n, -1)
        return cls(KIND_Q4_F16, n, b.shape[1] * QK, b[..., 4:].contiguous(), d, m, bias, "Q4_1")

    @classmethod
    def from_q4_0(cls, blocks: np.ndarray | torch.Tensor, bias: torch.Tensor | None = None):
        """GGUF Q4_0 rows ``[N, K/32 * 18]`` (fp16 d, 16 bytes of nibbles; w = d * (q - 8)):
        stored as Q4 with ``m = -8 d`` (exact in fp16)."""
        b, d = _blocks(blocks, 18)
        n = b.shape[0]
        m = (d.float() * -8).half()
        return cls(KIND_Q4_F16, n, b.shape[1] * QK, b[..., 2:].contiguous(), d, m, bias, "Q4_0")

    @classmethod
    def from_q8_0(cls, blocks: np.ndarray | torch.Tensor, bias: torch.Tensor | None = None):
        """GGUF Q8_0 rows ``[N, K/32 * 34]`` (fp16 d, 32 int8 values per block)."""
        b, d = _blocks(blocks, 34)
        n = b.shape[0]
        q = b[..., 2:].contiguous().view(torch.int8).reshape(n, -1)
        return cls(KIND_Q8_F16, n, b.shape[1] * QK, q, d, None, bias, "Q8_0")

    @classmethod
    def from_int4(cls, layer: Int4Linear) -> PackedLinear:
        """An :class:`Int4Linear` of any group size that is a multiple of 32 (larger groups are
        split into 32s sharing their scale and zero: exact)."""
        n, k, gs = layer.out_features, layer.in_features, layer.group_size
        if gs % QK:
            raise ValueError(f"int4 group size {gs} is not a multiple of {QK}")
        q = layer.unpack().view(n, k // QK, QK)
        nibbles = (q[..., :16] | (q[..., 16:] << 4)).contiguous()  # [N, G, 16]
        scale = layer.scale.float().repeat_interleave(gs // QK, dim=1)
        zero = layer.zero.float().repeat_interleave(gs // QK, dim=1)
        d, m = scale, zero - 8 * scale
        fmt = f"int4 (group {gs})"
        if _f16_exact(d) and _f16_exact(m):
            return cls(KIND_Q4_F16, n, k, nibbles, d.half(), m.half(), layer.bias, fmt)
        return cls(KIND_Q4_F32, n, k, nibbles, d, m, layer.bias, fmt)

    @classmethod
    def from_int8(cls, layer: Int8Linear) -> PackedLinear:
        """An :class:`Int8Linear` (one scale per output row)."""
        return cls(KIND_Q8_ROW, layer.out_features, layer.in_features, layer.qweight,
                   layer.scale.float(), None, layer.bias, "int8 (per row)")

    @classmethod
    def from_fp8(cls, q: torch.Tensor, scale: torch.Tensor, rows: torch.Tensor, block_k: int,
                 bias: torch.Tensor | None = None) -> PackedLinear:
        """FP8 weights as stored: ``q`` ``[N, K]`` uint8 (float8_e4m3fn codes, no NaN),
        ``scale`` ``[R, ceil(K / block_k)]`` fp32 block scales (below 2^120), ``rows`` ``[N]``
        the scale row of each weight row: ``w[n, k] = e4m3(q[n, k]) * scale[rows[n], k //
        block_k]``. Each scale row is widened to one scale per input (4 bytes per input and
        scale row: ``4 / bn`` bytes per weight in blocks of ``bn`` rows). Any ``K``: the
        kernels widen a row's last ``K % 32`` from a zero-padded copy."""
        n, k = q.shape
        d = (scale.float() * FP8_SCALE_SHIFT).repeat_interleave(block_k, dim=1)[:, :k]
        fmt = f"fp8 e4m3 ({'per tensor' if block_k == k else f'{block_k}-input blocks'})"
        return cls(KIND_FP8, n, k, q.view(torch.uint8), d, rows.to(torch.int32), bias, fmt)

    # -- use -----------------------------------------------------------------------------------
    def struct(self) -> LinStruct:
        """The ``tnd::Lin`` pointing at this module's buffers (rebuilt if they moved)."""
        ptrs = tuple(0 if t is None else t.data_ptr() for t in (self.q, self.d, self.m, self.bias))
        if self._struct is None or ptrs != self._struct_ptrs:
            self._struct = LinStruct(self.kind, self.out_features, self.in_features,
                                     _ptr(self.q, _U8), _ptr(self.d, _F), _ptr(self.m, _F),
                                     _ptr(self.bias, _F))
            self._struct_ptrs = ptrs
        return self._struct

    def dequantize(self) -> torch.Tensor:
        """The fp32 weight ``[N, K]`` these blocks stand for."""
        return self.dequantize_rows(torch.arange(self.out_features))

    def dequantize_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows ``rows`` of the fp32 weight: ``[len(rows), K]``."""
        n, g = rows.numel(), self.in_features // QK
        if self.kind == KIND_FP8:  # the scale shift undone exactly (a power of two)
            scale = self.d[self.m[rows].long()] / FP8_SCALE_SHIFT
            return self.q[rows].view(torch.float8_e4m3fn).float() * scale
        if self.kind in (KIND_Q4_F16, KIND_Q4_F32):
            nib = self.q[rows]  # [n, G, 16]
            q = torch.cat([nib & 0x0F, nib >> 4], dim=-1).float()  # [n, G, 32]
            w = q * self.d[rows].float()[..., None] + self.m[rows].float()[..., None]
            return w.view(n, -1)
        if self.kind == KIND_Q8_F16:
            q = self.q[rows].float().view(n, g, QK)
            return (q * self.d[rows].float()[..., None]).view(n, -1)
        return self.q[rows].float() * self.d[rows][:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [M, K] -> [M, N]
        lib = load()
        if lib is None or x.device.type != "cpu":
            return F.linear(x.float(), self.dequantize(), self.bias).to(x.dtype)
        shape = x.shape
        xf = x.reshape(-1, self.in_features).float().contiguous()
        y = torch.empty(xf.shape[0], self.out_features, dtype=torch.float32)
        lib.tnd_linear(ctypes.byref(self.struct()), ctypes.c_void_p(xf.data_ptr()), xf.shape[0],
                       ctypes.c_void_p(y.data_ptr()), torch.get_num_threads())
        return y.view(*shape[:-1], self.out_features).to(x.dtype)

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        """Table rows ``ids`` as fp32 ``[*ids.shape, K]`` (an embedding lookup)."""
        flat = ids.reshape(-1).to(torch.int64).contiguous()
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.out_features):
            raise IndexError("token id outside the embedding table")
        lib = load()
        if lib is None:
            out = self.dequantize_rows(flat)
        else:
            out = torch.empty(flat.numel(), self.in_features, dtype=torch.float32)
            lib.tnd_embed(ctypes.byref(self.struct()), ctypes.c_void_p(flat.data_ptr()),
                          flat.numel(), ctypes.c_void_p(out.data_ptr()))
        return out.view(*ids.shape, self.in_features)

    def weight_bytes(self) -> int:
        """Bytes this layer holds (weights, scales, bias)."""
        return sum(t.numel() * t.element_size() for t in (self.q, self.d, self.m, self.bias)
                   if t is not None)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, {self.format}"


def takes_any_k(layer: nn.Module) -> bool:
    """Whether the kernels take ``layer`` whatever its input width: FP8 rows (fp8_weights.h);
    the other kinds read whole groups of 32 inputs."""
    return isinstance(layer, PackedLinear) and layer.kind == KIND_FP8


class PackedEmbedding(nn.Module):
    """An embedding whose table is a :class:`PackedLinear` (shared with a tied lm_head)."""

    def __init__(self, table: PackedLinear) -> None:
        super().__init__()
        self.table = table
        self.num_embeddings, self.embedding_dim = table.out_features, table.in_features

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table.embedding(ids)
