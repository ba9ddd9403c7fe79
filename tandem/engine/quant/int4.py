"""Weight-only int4 linear layer: groups of ``group_size`` inputs share a scale and a zero.

    w[n, k] ~= (q[n, k] - 8) * scale[n, g] + zero[n, g]     q in 0..15, g = k // group_size

That is the convention of torch's ``_weight_int4pack_mm_for_cpu`` (checked in the tests). A
GGUF Q4_1 block (fp16 ``d`` and ``m``, 32 nibbles, ``w = d * q + m``) maps onto it exactly:
``scale = d``, ``zero = m + 8 d``, same ``q``; ``from_q4_1`` takes the nibbles as they are.

Buffers: ``qweight`` ``[N, K/2]`` uint8 (even k in the low nibble) with fp32 ``scale`` and
``zero`` ``[N, K/g]`` are the canonical form (dequantization, the Triton kernel); on CPU the
layer also keeps torch's opaque int4 pack and bf16 scales for the decode kernel.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from tandem.engine.models.linear import cpu_linear

GROUP_SIZE = 32
# Rows at or above which a CPU step dequantizes to fp32 (unpacking costs ~0.6 ms per
# 1536x576 matrix, so the int4 kernel keeps more rows than the int8 one; measured, 2-core AVX2).
DEQUANT_MIN_ROWS = 64
Q4_1_BLOCK_BYTES = 20  # fp16 d, fp16 m, 16 bytes of nibbles


class Int4Linear(nn.Module):
    """``y = x @ dequant(q)^T + bias`` with grouped asymmetric int4 weights."""

    def __init__(
        self,
        q: torch.Tensor,  # [N, K] uint8 values 0..15
        scale: torch.Tensor,  # [N, K / group_size]
        zero: torch.Tensor,  # [N, K / group_size]
        bias: torch.Tensor | None,
        group_size: int = GROUP_SIZE,
    ) -> None:
        super().__init__()
        n, k = q.shape
        if k % group_size or k % 2:
            raise ValueError(f"in_features {k} is not a multiple of the group size {group_size}")
        self.out_features, self.in_features, self.group_size = n, k, group_size
        q = q.to(torch.uint8)
        self.register_buffer("qweight", (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous())
        self.register_buffer("scale", scale.float().contiguous())
        self.register_buffer("zero", zero.float().contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.register_buffer("cpu_pack", None)
        self.register_buffer("cpu_scale_zero", None)
        if q.device.type == "cpu" and n % 16 == 0:  # the CPU pack wants N in 16s
            self.prepare_cpu(q)

    def prepare_cpu(self, q: torch.Tensor | None = None) -> None:
        """Build the CPU kernel's pack (``[N, K/2]`` opaque) and bf16 ``[K/g, N, 2]`` scales."""
        q = self.unpack() if q is None else q
        self.cpu_pack = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
        sz = torch.stack([self.scale.t(), self.zero.t()], dim=-1)
        self.cpu_scale_zero = sz.to(torch.bfloat16).contiguous()

    @classmethod
    def from_float(
        cls, weight: torch.Tensor, bias: torch.Tensor | None = None, group_size: int = GROUP_SIZE
    ) -> Int4Linear:
        """Min/max quantization of each group to 16 levels (scale, zero rounded to bf16 first,
        so the CPU kernel's bf16 copies are exact)."""
        n, k = weight.shape
        w = weight.detach().float().view(n, k // group_size, group_size)
        lo, hi = w.amin(dim=-1), w.amax(dim=-1)
        scale = ((hi - lo) / 15).clamp(min=1e-8).to(torch.bfloat16).float()
        zero = (lo + 8 * scale).to(torch.bfloat16).float()
        q = torch.round((w - zero[..., None]) / scale[..., None] + 8).clamp(0, 15)
        return cls(q.view(n, k).to(torch.uint8), scale, zero, bias, group_size)

    @classmethod
    def from_q4_1(cls, blocks: np.ndarray | torch.Tensor, bias: torch.Tensor | None = None):
        """Build from GGUF Q4_1 rows ``[N, K/32 * 20]`` uint8, without going through floats."""
        raw = torch.as_tensor(np.ascontiguousarray(blocks), dtype=torch.uint8)
        n = raw.shape[0]
        b = raw.view(n, -1, Q4_1_BLOCK_BYTES)  # [N, G, 20]
        d = b[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()  # [N, G]
        m = b[..., 2:4].contiguous().view(torch.float16).squeeze(-1).float()
        qs = b[..., 4:]  # [N, G, 16]: element j in the low nibble, j + 16 in the high one
        q = torch.cat([qs & 0x0F, qs >> 4], dim=-1).reshape(n, -1)  # [N, K]
        return cls(q, d, m + 8 * d, bias, group_size=32)

    def unpack(self) -> torch.Tensor:
        """``q`` ``[N, K]`` uint8 in 0..15."""
        p = self.qweight
        return torch.stack([p & 0x0F, p >> 4], dim=-1).view(self.out_features, self.in_features)

    def dequantize(self) -> torch.Tensor:
        """The fp32 weight ``[N, K]`` this layer stands for (exact in fp32)."""
        n, k, g = self.out_features, self.in_features, self.group_size
        q = self.unpack().view(n, k // g, g).float()
        return ((q - 8) * self.scale[..., None] + self.zero[..., None]).view(n, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [M, K] -> [M, N]
        if x.device.type == "cuda":
            from tandem.engine.quant.triton_matmul import int4_matmul

            y = int4_matmul(x, self.qweight, self.scale, self.zero, self.group_size)
        elif x.shape[0] >= DEQUANT_MIN_ROWS or self.cpu_pack is None:
            bias = None if self.bias is None else self.bias.float()
            return cpu_linear(x.float(), self.dequantize(), bias).to(x.dtype)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x.to(torch.bfloat16), self.cpu_pack, self.group_size, self.cpu_scale_zero
            )
        y = y.to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, int4 group={self.group_size}"
