"""Linear layers tuned for the CPUs we serve on, identical in math to ``nn.Linear``.

Two measured facts about the 2-core AMD EPYC (AVX2) dev box shape this file:
- oneDNN's linear (``mkldnn._linear_pointwise``) beats MKL's sgemm, which ``F.linear`` uses,
  by 1.2-1.5x on fp32 (decode rows and prefill chunks alike): MKL takes slow paths on AMD.
- torch's bf16 GEMM without AVX512-BF16 runs at ~15 GFLOP/s against ~50-120 for fp32. A bf16
  GEMM accumulates in fp32 and rounds once, so for bf16 models we keep, next to the bf16
  weights (read by bandwidth-bound small-batch steps), an fp32 copy used for steps with at
  least ``SHADOW_MIN_ROWS`` rows, where compute is the limit. Where tandem/engine/native's fused
  forward serves the model, nothing runs these layers' forward and no copy is made.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tandem.engine.platform import cpu_has_native_bf16, onednn_linear_available

SHADOW_MIN_ROWS = 8


def cpu_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` through oneDNN for fp32 CPU tensors, plain ``F.linear`` otherwise."""
    if x.dtype == torch.float32 and x.device.type == "cpu" and onednn_linear_available():
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """``nn.Linear`` with the CPU fast paths above."""

    shadow_weight: torch.Tensor | None = None
    shadow_bias: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.shadow_weight is not None and x.shape[0] >= SHADOW_MIN_ROWS:
            return cpu_linear(x.float(), self.shadow_weight, self.shadow_bias).to(x.dtype)
        return cpu_linear(x, self.weight, self.bias)


def attach_fp32_shadows(model: nn.Module) -> int:
    """Give every bf16 CPU ``Linear`` without one an fp32 shadow, when the CPU has no bf16
    arithmetic; returns the bytes added."""
    if cpu_has_native_bf16():
        return 0
    added = 0
    for module in model.modules():
        if (isinstance(module, Linear) and module.weight.dtype == torch.bfloat16
                and module.weight.device.type == "cpu" and module.shadow_weight is None):
            module.shadow_weight = module.weight.detach().float()
            if module.bias is not None:
                module.shadow_bias = module.bias.detach().float()
            added += module.shadow_weight.numel() * 4
    return added


__all__ = ["SHADOW_MIN_ROWS", "Linear", "attach_fp32_shadows", "cpu_linear"]
