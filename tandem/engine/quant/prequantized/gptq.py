"""GPTQ checkpoints (AutoGPTQ / GPTQModel): int4, groups along K, zero points, no act-order.

    qweight  int32 [K/8, N]    nibble i of qweight[r, n] is q[8r + i, n]     (packed along K)
    qzeros   int32 [K/g, N/8]  nibble i of qzeros[g, c] is z'[g, 8c + i]     (packed along N)
    scales   fp16  [K/g, N]
    g_idx    int32 [K]         k // g unless act-order (desc_act) permuted the groups
    w[n, k] = (q[k, n] - z[k // g, n]) * s[k // g, n]

The v1 layout (``checkpoint_format`` "gptq", AutoGPTQ) stores ``z' = z - 1``: its packer
subtracts one and every reference kernel adds it back (``(z' & 0xF) + 1``, so z reaches 16);
symmetric checkpoints therefore hold 7 for z = 8. GPTQModel's "gptq_v2" stores z itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tandem.engine.errors import ModelLoadError
from tandem.engine.quant.prequantized.base import (
    PrequantizedFormat,
    TensorSource,
    check_group_size,
    check_trivial_g_idx,
    unsupported,
)
from tandem.engine.quant.prequantized.unpacked import Int4Weight, unpack_int32

# checkpoint_format -> what its qzeros lack of z
ZERO_OFFSETS = {"gptq": 1, "gptq_v2": 0}


@dataclass(frozen=True, slots=True)
class GptqFormat(PrequantizedFormat):
    """A GPTQ checkpoint with groups of ``group_size`` in column order."""

    group_size: int
    symmetric: bool
    zero_offset: int  # added to the stored zero points (1 for v1, 0 for v2)

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> GptqFormat:
        """Validate ``quantization_config`` (or AutoGPTQ's ``quantize_config.json``)."""
        bits = cfg.get("bits")
        if bits != 4:
            raise unsupported("gptq", f"{bits}-bit weights")
        if cfg.get("desc_act"):
            raise unsupported("gptq", "desc_act true (act-order)")
        fmt = str(cfg.get("checkpoint_format") or cfg.get("format") or "gptq").lower()
        if fmt not in ZERO_OFFSETS:
            raise unsupported("gptq", f"checkpoint_format {fmt!r}")
        if cfg.get("dynamic"):
            raise unsupported("gptq", "per-module overrides ('dynamic')")
        group_size = check_group_size("gptq", cfg.get("group_size"))
        return cls(group_size, bool(cfg.get("sym", True)), ZERO_OFFSETS[fmt])

    @property
    def split_group(self) -> int | None:
        return self.group_size

    @property
    def label(self) -> str:
        return f"gptq-int4-g{self.group_size}-{'sym' if self.symmetric else 'asym'}"

    def is_quantized(self, prefix: str, tensors: TensorSource) -> bool:
        return prefix + ".qweight" in tensors

    def unpack(self, prefix: str, tensors: TensorSource) -> Int4Weight:
        qweight = tensors.get(prefix + ".qweight")  # [K/8, N]
        qzeros = tensors.get(prefix + ".qzeros")  # [K/g, N/8]
        scales = tensors.get(prefix + ".scales")  # [K/g, N]
        k, n, g = qweight.shape[0] * 8, qweight.shape[1], self.group_size
        if k % g or qzeros.shape != (k // g, n // 8) or scales.shape != (k // g, n):
            raise ModelLoadError(
                f"{prefix}: GPTQ shapes qweight {tuple(qweight.shape)}, qzeros "
                f"{tuple(qzeros.shape)}, scales {tuple(scales.shape)} disagree (group {g})"
            )
        if prefix + ".g_idx" in tensors:
            check_trivial_g_idx("gptq", tensors.get(prefix + ".g_idx"), k, g)
        q = unpack_int32(qweight, 4, dim=0)  # [K, N]
        z = unpack_int32(qzeros, 4, dim=1).to(torch.int16) + self.zero_offset  # [K/g, N]
        return Int4Weight.from_zero_points(q.t(), z.t(), scales.t(), g)
