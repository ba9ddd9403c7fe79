"""FP8 checkpoints (``quant_method: fp8``): e4m3 weights with per-tensor or block-wise scales,
dequantized at load into the model's float dtype.

    per tensor   weight            float8_e4m3fn [N, K]
                 weight_scale      fp32, one value ([] or [1])
                 w = weight.float() * weight_scale
    block-wise   weight            float8_e4m3fn [N, K]       (DeepSeek-V3, Qwen3-FP8:
                 weight_scale_inv  fp32 [ceil(N/bn), ceil(K/bk)]   weight_block_size [bn, bk])
                 w[n, k] = weight[n, k].float() * weight_scale_inv[n // bn, k // bk]

``weight_scale_inv`` multiplies despite its name (it is the inverse of the quantizer's scale),
as transformers' and vLLM's dequantization read it. Activations are quantized dynamically in
those runtimes (``activation_scheme: dynamic``); here they stay float, so only the weights'
rounding is the checkpoint's. A linear stored in float (``lm_head``, the MoE router, whatever
``modules_to_not_convert`` / ``ignored_layers`` name) has no scale and loads as it is. Refused
by name: static activation scales (``input_scale``), e5m2 weights, a KV cache scheme, a scale
that does not fit its weight, an fp8 weight without a scale.

Dequantized at load (not in the kernels): every weight path, the native CPU forward included,
then runs the model as a float checkpoint of the same values; the weights occupy the model
dtype's bytes, not one byte per value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tandem.engine.errors import ModelLoadError
from tandem.engine.quant.prequantized.base import PrequantizedFormat, TensorSource, unsupported
from tandem.engine.quant.prequantized.unpacked import QuantizedWeight

NAME = "fp8"
FP8 = torch.float8_e4m3fn


@dataclass(frozen=True, slots=True)
class Fp8Format(PrequantizedFormat):
    """An FP8 checkpoint: its scales are per tensor, or per ``block`` (rows, columns)."""

    block: tuple[int, int] | None

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> Fp8Format:
        """Validate ``quantization_config``; refuse what we cannot load exactly."""
        scheme = cfg.get("activation_scheme", "dynamic")
        if scheme != "dynamic":
            raise unsupported(NAME, f"activation_scheme {scheme!r} (static input_scale)")
        fmt = str(cfg.get("fmt", "e4m3")).lower()
        if fmt != "e4m3":
            raise unsupported(NAME, f"fmt {fmt!r} (e4m3 weights only)")
        if cfg.get("kv_cache_scheme"):
            raise unsupported(NAME, "KV cache quantization (kv_cache_scheme)")
        block = cfg.get("weight_block_size")
        if block is None:
            return cls(None)
        if (not isinstance(block, list | tuple) or len(block) != 2
                or not all(type(b) is int and b > 0 for b in block)):
            raise unsupported(NAME, f"weight_block_size {block!r} (two positive integers)")
        return cls((block[0], block[1]))

    @property
    def label(self) -> str:
        return f"fp8-block{self.block[0]}x{self.block[1]}" if self.block else "fp8-tensor"

    @property
    def dequantizes_at_load(self) -> bool:
        return True

    def is_quantized(self, prefix: str, tensors: TensorSource) -> bool:
        return False  # every linear becomes float at load (float_weight)

    def unpack(self, prefix: str, tensors: TensorSource) -> QuantizedWeight:
        raise ModelLoadError(f"{prefix}: an fp8 checkpoint is dequantized at load")

    def float_weight(self, prefix: str, tensors: TensorSource) -> torch.Tensor:
        """The linear's weight ``[N, K]`` in fp32: dequantized when it is stored in fp8, as it
        is otherwise; its scale is consumed."""
        weight = tensors.get(prefix + ".weight")
        per_tensor, per_block = prefix + ".weight_scale", prefix + ".weight_scale_inv"
        has = [name for name in (per_tensor, per_block) if name in tensors]
        if weight.dtype != FP8:
            if weight.dtype.is_floating_point and weight.itemsize == 1:
                raise unsupported(NAME, f"{prefix}.weight is {weight.dtype} (e4m3 only)")
            if has:
                raise ModelLoadError(f"{has[0]} scales {prefix}.weight, which is "
                                     f"{weight.dtype}, not float8_e4m3fn")
            return weight
        if prefix + ".input_scale" in tensors:
            raise unsupported(NAME, f"{prefix}.input_scale (static activation scales)")
        if len(has) != 1:
            raise ModelLoadError(f"{prefix}.weight is float8_e4m3fn with "
                                 f"{'no scale' if not has else 'two scales'} "
                                 "(weight_scale or weight_scale_inv)")
        n, k = weight.shape
        if has[0] == per_tensor:
            if self.block is not None:
                raise ModelLoadError(f"{per_tensor}: a per-tensor scale in a checkpoint of "
                                     f"weight_block_size {list(self.block)}")
            scale = tensors.get(per_tensor).float()
            if scale.numel() != 1:
                raise ModelLoadError(f"{per_tensor} has shape {tuple(scale.shape)}, expected "
                                     "one value")
            return weight.float() * scale.reshape(())
        if self.block is None:
            raise ModelLoadError(f"{per_block}: block scales without weight_block_size")
        bn, bk = self.block
        scale = tensors.get(per_block).float()
        want = (-(-n // bn), -(-k // bk))
        if tuple(scale.shape) != want:
            raise ModelLoadError(f"{per_block} has shape {tuple(scale.shape)}, expected {want} "
                                 f"for a [{n}, {k}] weight in blocks of {bn}x{bk}")
        wide = scale.repeat_interleave(bn, dim=0)[:n].repeat_interleave(bk, dim=1)[:, :k]
        return weight.float() * wide
