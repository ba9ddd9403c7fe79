"""Native CPU kernels (AVX2, or AVX-512/VNNI where the CPU has it; :func:`isa` says which):
a fused whole-model forward for every CPU step of an fp32, bf16 or fp16 model, and
PackedLinear, the layout quantized weights are held in on the CPU.

``decode_step.cpp`` is compiled on first use (or by ``python -m tandem.engine.native``) and loaded
with ctypes; without a compiler or AVX2 the engine runs its torch path unchanged.
docs/native_cpu.md has the map.
"""

from tandem.engine.native.build import NativeISAError, build, cpu_supported, isa, load
from tandem.engine.native.fused_forward import FusedForward, NativeLinear, unsupported_reason

__all__ = ["FusedForward", "NativeISAError", "NativeLinear", "build", "cpu_supported", "isa",
           "load", "unsupported_reason"]
