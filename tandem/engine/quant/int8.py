"""Weight-only int8 linear layer: one symmetric scale per output channel.

    w[n, k] ~= q[n, k] * scale[n]      q int8 in [-127, 127], scale = max|w[n]| / 127

The scale is rounded to bf16 *before* ``q`` is computed, so the bf16 scale the CPU kernel
reads is exact and the fp32 dequantized weight equals the kernel's weight bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn

from tandem.engine.models.linear import cpu_linear

# Rows at or above which a CPU step dequantizes to fp32 and runs the fp32 GEMM instead of the
# int8 kernel (measured on the 2-core AVX2 box: the kernel wins at 8 rows, loses at 64).
DEQUANT_MIN_ROWS = 32
# torch's int8 CPU kernel loads the weight with aligned AVX-512 loads where the CPU has them:
# a weight at an odd address (a view into a safetensors file or a packed buffer) segfaults it.
ALIGN_BYTES = 64
# torch's int8 CPU kernel reads the reduction dimension in blocks of 32: for any other K it
# reads past each weight row and returns garbage or segfaults (K = 8, 72, 104 on an AVX-512
# Xeon), so such layers take the dequantized fp32 path at every row count.
KERNEL_K = 32


def aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous and starting on an ``ALIGN_BYTES`` boundary (a copy only if needed:
    torch's CPU allocator aligns every new tensor)."""
    t = t.contiguous()
    return t if t.data_ptr() % ALIGN_BYTES == 0 else t.clone()


class Int8Linear(nn.Module):
    """``y = x @ (q * scale)^T + bias`` with int8 ``q`` ``[N, K]``."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        self.register_buffer("qweight", aligned(qweight))  # [N, K] int8
        self.register_buffer("scale", scale.float().contiguous())  # [N] fp32 (bf16-exact)
        self.register_buffer("scale_bf16", scale.to(torch.bfloat16).contiguous())  # [N]
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Int8Linear:
        """Quantize a float weight ``[N, K]`` per output channel."""
        w = weight.detach().float()
        amax = w.abs().amax(dim=1).clamp(min=1e-8)
        scale = (amax / 127).to(torch.bfloat16).float()
        # bf16 rounding may shrink the scale a little: clamp keeps q in range.
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        return cls(q, scale, bias)

    def dequantize(self) -> torch.Tensor:
        """The fp32 weight ``[N, K]`` this layer multiplies by."""
        return self.qweight.float() * self.scale[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [M, K] -> [M, N]
        if x.device.type == "cuda":
            from tandem.engine.quant.triton_matmul import int8_matmul

            y = int8_matmul(x, self.qweight, self.scale)
        elif x.shape[0] >= DEQUANT_MIN_ROWS or self.in_features % KERNEL_K:
            return cpu_linear(x.float(), self.dequantize(), _f32(self.bias)).to(x.dtype)
        else:
            y = torch.ops.aten._weight_int8pack_mm(
                x.to(torch.bfloat16), self.qweight, self.scale_bf16
            )
        y = y.to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, int8 per channel"


def _f32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.float()
