"""AWQ checkpoints (AutoAWQ's GEMM layout): int4, groups along K, one zero point per group.

    qweight  int32 [K, N/8]    8 columns per word, nibble i holds column 8c + AWQ_ORDER[i]
    qzeros   int32 [K/g, N/8]  same packing
    scales   fp16  [K/g, N]
    w[n, k] = (q[k, n] - z[k // g, n]) * s[k // g, n]

The nibble order [0, 2, 4, 6, 1, 3, 5, 7] is what AutoAWQ's packer writes (it suits its CUDA
kernel's interleaved dequantization); vLLM and AutoAWQ undo it with [0, 4, 1, 5, 2, 6, 3, 7].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tandem.engine.errors import ModelLoadError
from tandem.engine.quant.prequantized.base import (
    PrequantizedFormat,
    TensorSource,
    check_group_size,
    unsupported,
)
from tandem.engine.quant.prequantized.unpacked import Int4Weight, unpack_int32

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of a word -> column offset in its 8


@dataclass(frozen=True, slots=True)
class AwqFormat(PrequantizedFormat):
    """An AutoAWQ GEMM checkpoint with groups of ``group_size``."""

    group_size: int

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> AwqFormat:
        """Validate ``quantization_config`` (or AutoAWQ's ``quant_config.json``)."""
        bits = cfg.get("bits", cfg.get("w_bit"))
        if bits != 4:
            raise unsupported("awq", f"{bits}-bit weights")
        version = str(cfg.get("version", "gemm")).lower()
        if version != "gemm":
            raise unsupported("awq", f"version {version!r} (only the GEMM layout)")
        if not cfg.get("zero_point", True):
            raise unsupported("awq", "zero_point false")
        return cls(check_group_size("awq", cfg.get("group_size", cfg.get("q_group_size"))))

    @property
    def split_group(self) -> int | None:
        return self.group_size

    @property
    def label(self) -> str:
        return f"awq-int4-g{self.group_size}"

    def is_quantized(self, prefix: str, tensors: TensorSource) -> bool:
        # modules_to_not_convert keep a plain .weight: presence says it.
        return prefix + ".qweight" in tensors

    def unpack(self, prefix: str, tensors: TensorSource) -> Int4Weight:
        qweight = tensors.get(prefix + ".qweight")  # [K, N/8]
        qzeros = tensors.get(prefix + ".qzeros")  # [K/g, N/8]
        scales = tensors.get(prefix + ".scales")  # [K/g, N]
        k, n, g = qweight.shape[0], qweight.shape[1] * 8, self.group_size
        if k % g or qzeros.shape != (k // g, n // 8) or scales.shape != (k // g, n):
            raise ModelLoadError(
                f"{prefix}: AWQ shapes qweight {tuple(qweight.shape)}, qzeros "
                f"{tuple(qzeros.shape)}, scales {tuple(scales.shape)} disagree (group {g})"
            )
        q = unpack_int32(qweight, 4, dim=1, order=AWQ_ORDER)  # [K, N]
        z = unpack_int32(qzeros, 4, dim=1, order=AWQ_ORDER)  # [K/g, N]
        return Int4Weight.from_zero_points(q.t(), z.t(), scales.t(), g)
