"""Native CPU kernels: a fused whole-model forward for quantized decode steps (AVX2).

``decode_step.cpp`` is compiled on first use (or by ``python -m engine.native``) and loaded
with ctypes; without a compiler or AVX2 the engine runs its torch path unchanged.
"""

from engine.native.build import build, cpu_supported, load
from engine.native.fused_forward import FusedForward, NativeLinear, unsupported_reason

__all__ = ["FusedForward", "NativeLinear", "build", "cpu_supported", "load",
           "unsupported_reason"]
