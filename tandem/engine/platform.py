"""Facts about the machine the engine runs on, looked up once."""

from __future__ import annotations

import functools

import torch


@functools.cache
def cpu_has_native_bf16() -> bool:
    """True when the CPU multiplies bf16 in hardware (AVX512-BF16 or AMX)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


@functools.cache
def onednn_linear_available() -> bool:
    """True when torch ships oneDNN's fused linear op (faster than MKL sgemm on AMD CPUs)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def cpu_emulates_bf16(t: torch.Tensor) -> bool:
    """A bf16 tensor on a CPU that has no bf16 arithmetic: compute it in fp32 instead."""
    return t.dtype == torch.bfloat16 and t.device.type == "cpu" and not cpu_has_native_bf16()
