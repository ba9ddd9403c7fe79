"""Linear layers, with an fp32 shadow for bf16 models on CPUs without native bf16 matmul.

On an AVX2-only CPU torch's bf16 GEMM runs at ~15 GFLOP/s against ~50-100 for fp32 (measured
on the 2-core dev box: a 32-row decode step of SmolLM2 takes 4x longer in bf16). A bf16
GEMM accumulates in fp32 and rounds once, so multiplying the same bf16 values in fp32 and
rounding the result gives the same numbers up to summation order. We therefore keep, next
to the bf16 weights (read by bandwidth-bound small-batch steps), an fp32 copy for steps with
more than ``SHADOW_MIN_ROWS`` rows, where compute is the limit.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

SHADOW_MIN_ROWS = 8


class Linear(nn.Linear):
    """``nn.Linear`` that can route large bf16 batches through an fp32 shadow weight."""

    shadow_weight: torch.Tensor | None = None
    shadow_bias: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.shadow_weight is not None and x.shape[0] >= SHADOW_MIN_ROWS:
            return F.linear(x.float(), self.shadow_weight, self.shadow_bias).to(x.dtype)
        return F.linear(x, self.weight, self.bias)


@functools.cache
def cpu_has_native_bf16() -> bool:
    """True when the CPU multiplies bf16 in hardware (AVX512-BF16 or AMX)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def attach_fp32_shadows(model: nn.Module) -> int:
    """Give every bf16 ``Linear`` of a CPU model an fp32 shadow; returns the bytes added."""
    added = 0
    for module in model.modules():
        if isinstance(module, Linear) and module.weight.dtype == torch.bfloat16:
            module.shadow_weight = module.weight.detach().float()
            if module.bias is not None:
                module.shadow_bias = module.bias.detach().float()
            added += module.shadow_weight.numel() * 4
    return added
