"""compressed-tensors checkpoints (llm-compressor): weight-only int4 groups and int8 channels.

    pack-quantized      weight_packed      int32 [N, ceil(K * b / 32)]  element k at bits
                                           (k * b) % 32 of word k * b // 32, stored as
                                           q + 2^(b-1) (q signed: -8..7 or -128..127)
                        weight_scale       [N, K/g] (group), [N, 1] (channel), [1] (tensor)
                        weight_zero_point  asymmetric only: int32 [ceil(N/8), K/g], packed
                                           along N like the weight (older releases: [N, K/g])
                        weight_shape       [2] = (N, K)
    int-quantized,      weight             int8 [N, K], the signed q itself
    naive-quantized     weight_scale       as above
    w[n, k] = (q[n, k] - zp[n, k // g]) * s[n, k // g]            (zp = 0 when symmetric)

Which linears are quantized, and how, comes from ``config_groups`` (``targets``: "Linear", a
module name, or "re:<regex>" matched from the start of the name) minus ``ignore``.
"""

from __future__ import annotations

import re
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
from tandem.engine.quant.prequantized.unpacked import (
    Int4Weight,
    Int8Weight,
    QuantizedWeight,
    unpack_int32,
)

NAME = "compressed-tensors"
FORMATS = ("pack-quantized", "int-quantized", "naive-quantized")
_COLUMN_ORDER = (None, False, "weight", "static")  # actorder values that keep groups in order


@dataclass(frozen=True, slots=True)
class WeightScheme:
    """One config group's weight quantization, validated to what we load."""

    targets: tuple[str, ...]
    fmt: str  # one of FORMATS
    bits: int  # 4 (group) or 8 (channel / tensor)
    strategy: str  # "group" | "channel" | "tensor"
    group_size: int | None
    symmetric: bool

    @property
    def label(self) -> str:
        if self.bits == 4:
            return f"int4-g{self.group_size}-{'sym' if self.symmetric else 'asym'}"
        return f"int8-{self.strategy}"

    @classmethod
    def from_group(cls, name: str, group: Any, default_fmt: str) -> WeightScheme | None:
        """Validate one ``config_groups`` entry (None: it quantizes nothing)."""
        if not isinstance(group, dict):
            raise unsupported(NAME, f"config group {name!r} is a preset, not a scheme")
        for acts in ("input_activations", "output_activations"):
            if group.get(acts):
                raise unsupported(NAME, f"activation quantization ({name}.{acts})")
        w = group.get("weights")
        if not w:
            return None
        fmt = group.get("format") or default_fmt
        if fmt not in FORMATS:
            raise unsupported(NAME, f"format {fmt!r}")
        if str(w.get("type", "int")).lower() != "int":
            raise unsupported(NAME, f"{w.get('type')} weights")
        if w.get("dynamic"):
            raise unsupported(NAME, "dynamic weight quantization")
        actorder = w.get("actorder")
        if actorder not in _COLUMN_ORDER:
            raise unsupported(NAME, f"actorder {actorder!r} (g_idx)")
        bits, sym, gs = w.get("num_bits", 8), bool(w.get("symmetric", True)), w.get("group_size")
        strategy = w.get("strategy") or ("tensor" if gs is None else "channel" if gs == -1
                                         else "group")
        targets = tuple(group.get("targets") or ())
        if bits == 4:
            if fmt != "pack-quantized":
                raise unsupported(NAME, f"int4 in {fmt!r} (int4 must be pack-quantized)")
            if strategy != "group":
                raise unsupported(NAME, f"int4 with strategy {strategy!r} (groups only)")
            return cls(targets, fmt, 4, "group", check_group_size(NAME, gs), sym)
        if bits == 8:
            if strategy not in ("channel", "tensor"):
                raise unsupported(NAME, f"int8 with strategy {strategy!r} (per channel only)")
            if not sym:
                raise unsupported(NAME, "asymmetric int8")
            return cls(targets, fmt, 8, strategy, None, True)
        raise unsupported(NAME, f"{bits}-bit weights")

    def unpack(self, prefix: str, tensors: TensorSource) -> QuantizedWeight:
        """This scheme's linear at ``prefix`` in our convention."""
        scale = tensors.get(prefix + ".weight_scale")
        if self.fmt == "pack-quantized":
            packed = tensors.get(prefix + ".weight_packed")  # [N, ceil(K * b / 32)]
            n, k = _weight_shape(prefix, packed, self.bits, tensors)
            # stored unsigned: q + 2^(b-1)
            stored = unpack_int32(packed, self.bits, dim=1)[:, :k].contiguous()  # [N, K]
        else:
            weight = tensors.get(prefix + ".weight")
            if weight.dtype != torch.int8:
                raise ModelLoadError(f"{prefix}.weight is {weight.dtype}, expected int8 ({self.fmt})")
            n, k = weight.shape
            stored = weight
        if prefix + ".weight_g_idx" in tensors and self.group_size is not None:
            check_trivial_g_idx(NAME, tensors.get(prefix + ".weight_g_idx"), k, self.group_size)
        if self.bits == 8:
            if self.fmt == "pack-quantized":
                stored = (stored.to(torch.int16) - 128).to(torch.int8)
            s = scale.float().reshape(-1)
            if s.numel() == 1:  # one scale for the tensor: the same for every channel
                s = s.expand(n)
            w8 = Int8Weight(stored, s.contiguous())
            w8.check()
            return w8
        g = self.group_size
        assert g is not None
        if self.symmetric:
            zp_stored = torch.full((n, k // g), 8, dtype=torch.int16)
        else:
            zp_stored = _zero_points(prefix, tensors.get(prefix + ".weight_zero_point"), n, k // g)
        return Int4Weight.from_zero_points(stored, zp_stored, scale, g)

    def matches(self, name: str) -> bool:
        """Whether a Linear named ``name`` is one of this scheme's targets."""
        return any(_match(name, t) for t in self.targets)


@dataclass(frozen=True, slots=True)
class CompressedTensorsFormat(PrequantizedFormat):
    """A compressed-tensors checkpoint: its weight schemes and ignored modules."""

    schemes: tuple[WeightScheme, ...]
    ignore: tuple[str, ...]

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> CompressedTensorsFormat:
        """Validate ``quantization_config``; refuse what we cannot load exactly."""
        status = cfg.get("quantization_status", "compressed")
        if status != "compressed":
            raise unsupported(NAME, f"quantization_status {status!r} (weights not compressed)")
        if cfg.get("kv_cache_scheme"):
            raise unsupported(NAME, "KV cache quantization (kv_cache_scheme)")
        sparsity = cfg.get("sparsity_config") or {}
        if sparsity.get("format", "dense") != "dense":
            raise unsupported(NAME, f"sparsity format {sparsity.get('format')!r}")
        if cfg.get("transform_config"):
            raise unsupported(NAME, "transforms (transform_config)")
        default_fmt = cfg.get("format", "dense")
        groups = cfg.get("config_groups") or {}
        schemes = [WeightScheme.from_group(k, v, default_fmt) for k, v in groups.items()]
        found = tuple(s for s in schemes if s is not None)
        if not found:
            raise unsupported(NAME, "no config group quantizes weights")
        return cls(found, tuple(cfg.get("ignore") or ()))

    @property
    def label(self) -> str:
        labels = sorted({s.label for s in self.schemes})
        return f"{NAME}-{labels[0] if len(labels) == 1 else 'mixed'}"

    @property
    def split_group(self) -> int | None:
        # the largest int4 group: the supported sizes (32, 64, 128) each divide the next
        return max((s.group_size for s in self.schemes if s.bits == 4 and s.group_size),
                   default=None)

    def scheme(self, prefix: str) -> WeightScheme | None:
        """The scheme of the Linear ``prefix``, or None when it is ignored or untargeted."""
        if any(_match(prefix, i) for i in self.ignore):
            return None
        return next((s for s in self.schemes if s.matches(prefix)), None)

    def is_quantized(self, prefix: str, tensors: TensorSource) -> bool:
        return self.scheme(prefix) is not None

    def unpack(self, prefix: str, tensors: TensorSource) -> QuantizedWeight:
        scheme = self.scheme(prefix)
        if scheme is None:
            raise ModelLoadError(f"{prefix} is not quantized in this checkpoint")
        return scheme.unpack(prefix, tensors)


def _match(name: str, target: str) -> bool:
    # Our checkpoint linears are all nn.Linear, so the class target "Linear" takes them all.
    if target == "Linear":
        return True
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == name


def _weight_shape(prefix: str, packed: torch.Tensor, bits: int, t: TensorSource) -> tuple[int, int]:
    n, words = packed.shape
    if prefix + ".weight_shape" not in t:
        return n, words * 32 // bits
    shape = [int(v) for v in t.get(prefix + ".weight_shape").tolist()]
    if len(shape) != 2 or shape[0] != n or -(-shape[1] * bits // 32) != words:
        raise ModelLoadError(f"{prefix}: weight_shape {shape} does not fit weight_packed "
                             f"{tuple(packed.shape)}")
    return shape[0], shape[1]


def _zero_points(prefix: str, zp: torch.Tensor, n: int, groups: int) -> torch.Tensor:
    """Asymmetric int4 zero points ``[N, K/g]`` as stored values (zp + 8)."""
    if zp.dtype == torch.int32 and zp.shape == (-(-n // 8), groups):  # packed along N
        return unpack_int32(zp, 4, dim=0)[:n].to(torch.int16)
    if zp.shape == (n, groups) and not zp.dtype.is_floating_point:  # older: the signed zp
        return zp.to(torch.int16) + 8
    raise ModelLoadError(f"{prefix}.weight_zero_point {tuple(zp.shape)} {zp.dtype} fits neither "
                         f"the packed [{-(-n // 8)}, {groups}] int32 nor the plain [{n}, {groups}]")
