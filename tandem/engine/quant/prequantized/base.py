"""What every pre-quantized format answers, and the dense checkpoint as its null object.

A format reader is asked, per checkpoint linear (``model.layers.0.self_attn.q_proj``): is it
stored quantized, and if so, what are its values in our convention (``unpacked.py``)? The
loader (tandem/engine/models/weights.py) never branches on the format itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

import torch

from tandem.engine.errors import ModelLoadError
from tandem.engine.quant.prequantized.unpacked import QuantizedWeight

# Group sizes our int4 kernels are built and tested for (torch's CPU int4 kernel, Triton).
SUPPORTED_GROUP_SIZES = (32, 64, 128)
SUPPORTED = (
    "awq (GEMM, int4, zero points, group 32/64/128); "
    "gptq (int4, group 32/64/128, sym or asym, desc_act false); "
    "compressed-tensors (weight-only: pack-quantized int4 group 32/64/128 sym or asym, "
    "int8 per channel in pack-quantized, int-quantized or naive-quantized); "
    "fp8 (e4m3, per-tensor weight_scale or block-wise weight_scale_inv, dynamic activations; "
    "kept in e4m3 for the native CPU kernels, dequantized at load elsewhere)"
)
# Tensor suffixes that only quantized checkpoints hold.
_QUANTIZED_SUFFIXES = (".qweight", ".weight_packed", ".weight_scale")


class TensorSource(Protocol):
    """Name -> tensor lookup over a checkpoint's safetensors shards."""

    def __contains__(self, name: str) -> bool: ...

    def get(self, name: str) -> torch.Tensor: ...


def unsupported(fmt: str, what: str) -> ModelLoadError:
    """The error for a checkpoint we cannot load exactly: names it and what we support."""
    return ModelLoadError(f"unsupported pre-quantized checkpoint ({fmt}): {what}. Supported: "
                          f"{SUPPORTED}")


def check_group_size(fmt: str, group_size: object) -> int:
    """``group_size`` when our int4 kernels take it, else the unsupported-format error."""
    if not isinstance(group_size, int) or group_size not in SUPPORTED_GROUP_SIZES:
        raise unsupported(fmt, f"group size {group_size!r}")
    return group_size


def check_trivial_g_idx(fmt: str, g_idx: torch.Tensor, k: int, group_size: int) -> None:
    """Refuse act-order: a ``g_idx`` other than ``k // group_size`` permutes the groups."""
    want = torch.arange(k, device=g_idx.device) // group_size
    if g_idx.shape != (k,) or not torch.equal(g_idx.long(), want):
        raise unsupported(fmt, "act-order (a g_idx that is not k // group_size)")


class PrequantizedFormat(ABC):
    """How a checkpoint stores its quantized linear layers."""

    @property
    @abstractmethod
    def label(self) -> str:
        """Short name with bits and groups, e.g. ``awq-int4-g128`` (logs, /v1/models)."""

    @abstractmethod
    def is_quantized(self, prefix: str, tensors: TensorSource) -> bool:
        """Whether the linear at ``prefix`` (HF module name) is stored quantized."""

    @abstractmethod
    def unpack(self, prefix: str, tensors: TensorSource) -> QuantizedWeight:
        """The quantized linear at ``prefix`` in our convention; raises ModelLoadError."""

    def for_native_kernels(self) -> PrequantizedFormat:
        """This format as read for the native CPU kernels (a model of any float dtype): one
        that has a layout of its own there (FP8) keeps its linears in it rather than
        dequantizing them; the others are read the same way everywhere."""
        return self

    def dequantizes(self, module: str) -> str | None:
        """Why our linear ``module`` (``layers.0.self_attn.kv_b_proj``), stored quantized, is
        dequantized at load by ``float_weight`` instead of kept quantized; None: it is kept
        (only a format that can dequantize, FP8, ever gives a reason)."""
        return None

    @property
    def split_group(self) -> int | None:
        """The input columns one scale covers, which a tensor-parallel split of a row-parallel
        layer must keep whole (None: per-channel scales, or float weights)."""
        return None

    @property
    def dequantizes_at_load(self) -> bool:
        """Whether the format's stored weights become float at load (``float_weight``)
        rather than quantized layers (``unpack``): all of them, or those it does not keep
        (``for_native_kernels``, ``dequantizes``)."""
        return False

    def float_weight(self, prefix: str, tensors: TensorSource) -> torch.Tensor:
        """The weight ``[N, K]`` of a linear loaded as float (``is_quantized`` false): as
        stored, or dequantized by a format that ``dequantizes_at_load``."""
        return tensors.get(prefix + ".weight")


class Dense(PrequantizedFormat):
    """A checkpoint without ``quantization_config``: every linear is float."""

    @property
    def label(self) -> str:
        return "none"

    def is_quantized(self, prefix: str, tensors: TensorSource) -> bool:
        for suffix in _QUANTIZED_SUFFIXES:
            if prefix + suffix in tensors:
                raise ModelLoadError(
                    f"{prefix}{suffix} looks pre-quantized, but the checkpoint's config.json "
                    "has no quantization_config"
                )
        return False

    def unpack(self, prefix: str, tensors: TensorSource) -> QuantizedWeight:
        raise ModelLoadError(f"{prefix} is not quantized in a dense checkpoint")


DENSE = Dense()
