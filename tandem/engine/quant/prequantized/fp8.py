"""FP8 checkpoints (``quant_method: fp8``): e4m3 weights with per-tensor or block-wise scales.

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
that does not fit its weight, an fp8 weight without a scale, the two e4m3 NaN codes in a
weight, a scale that is not finite or not below 2^120.

Two ways to hold the weights:

* kept (``Fp8Format.native``, the native CPU kernels serving an fp32, bf16 or fp16 model):
  each linear stays one byte per weight, its scales beside it (``Fp8Weight``), and the
  kernels widen and scale the bytes as they multiply (tandem/engine/native/fp8_weights.h,
  PackedLinear kind 7). Every weight the kernels use is ``e4m3 * scale`` rounded once to
  fp32: the dequantized value, with fp32 activations whatever the model's dtype (a bf16
  model's kept linears are not rounded to bf16 as its dequantized ones would be). The scales are held as one fp32 per input per block of rows (4 / bn bytes a weight:
  SmolLM2's decoder linears in 128 x 128 blocks 110 MB kept, 425 MB dequantized to fp32, 213 MB
  to bf16). Every linear of any width is kept (the kernels take any K) but MLA's
  ``kv_b_proj``, dequantized at load: its decode absorbs it into float matrices, as vLLM's
  does. The load log names the linears kept and those dequantized, with the reason.
* dequantized at load (everywhere else: CUDA, no compiler, ``--no-native-kernels``, tensor
  parallelism, ``--quantization none|int8|int4``): the model holds float linears of the same
  values, at the model dtype's bytes per weight.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from tandem.engine.errors import ModelLoadError
from tandem.engine.quant.prequantized.base import PrequantizedFormat, TensorSource, unsupported
from tandem.engine.quant.prequantized.unpacked import Fp8Weight

NAME = "fp8"
FP8 = torch.float8_e4m3fn
SCALE_LIMIT = 2.0 ** 120  # the kernels hold scale * 2^8 in fp32 (fp8_weights.h)


@dataclass(frozen=True, slots=True)
class Fp8Format(PrequantizedFormat):
    """An FP8 checkpoint: its scales are per tensor, or per ``block`` (rows, columns);
    ``native``: its linears kept in e4m3 for the native CPU kernels, not dequantized."""

    block: tuple[int, int] | None
    native: bool = False

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

    def for_native_kernels(self) -> Fp8Format:
        return dataclasses.replace(self, native=True)

    @property
    def label(self) -> str:
        return f"fp8-block{self.block[0]}x{self.block[1]}" if self.block else "fp8-tensor"

    @property
    def dequantizes_at_load(self) -> bool:
        return True  # what it does not keep (all of it unless ``native``)

    def is_quantized(self, prefix: str, tensors: TensorSource) -> bool:
        """Kept as e4m3 only for the native kernels (a scale beside it says it is fp8; the
        weight itself is checked when read); dequantized at load otherwise."""
        return self.native and any(prefix + s in tensors
                                   for s in (".weight_scale", ".weight_scale_inv"))

    def dequantizes(self, module: str) -> str | None:
        if module.endswith(".kv_b_proj"):  # as vLLM: its rows are folded into the queries
            return "multi-head latent attention absorbs kv_b_proj into float matrices"
        return None

    def unpack(self, prefix: str, tensors: TensorSource) -> Fp8Weight:
        """The e4m3 bytes of the linear at ``prefix`` and their scales, as stored."""
        stored = self._stored(prefix, tensors)
        if stored is None:
            raise ModelLoadError(f"{prefix}: a scale beside a weight not stored in fp8")
        weight, grid, (bn, bk) = stored
        rows = (torch.arange(weight.shape[0]) // bn).to(torch.int32)
        return Fp8Weight(weight.view(torch.uint8), grid.contiguous(), rows, bk)

    def float_weight(self, prefix: str, tensors: TensorSource) -> torch.Tensor:
        """The linear's weight ``[N, K]`` in fp32: dequantized when it is stored in fp8, as it
        is otherwise; its scale is consumed."""
        stored = self._stored(prefix, tensors)
        if stored is None:
            return tensors.get(prefix + ".weight")
        weight, grid, (bn, bk) = stored
        n, k = weight.shape
        if grid.numel() == 1:
            return weight.float() * grid.reshape(())
        wide = grid.repeat_interleave(bn, dim=0)[:n].repeat_interleave(bk, dim=1)[:, :k]
        return weight.float() * wide

    def _stored(self, prefix: str, tensors: TensorSource,
                ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]] | None:
        """``(weight [N, K] fp8, scale grid [ceil(N/bn), ceil(K/bk)] fp32, (bn, bk))`` of a
        linear stored in fp8 (a per-tensor scale: one block of the whole weight); None for
        one stored in float. Raises ModelLoadError for anything else."""
        weight = tensors.get(prefix + ".weight")
        per_tensor, per_block = prefix + ".weight_scale", prefix + ".weight_scale_inv"
        has = [name for name in (per_tensor, per_block) if name in tensors]
        if weight.dtype != FP8:
            if weight.dtype.is_floating_point and weight.itemsize == 1:
                raise unsupported(NAME, f"{prefix}.weight is {weight.dtype} (e4m3 only)")
            if has:
                raise ModelLoadError(f"{has[0]} scales {prefix}.weight, which is "
                                     f"{weight.dtype}, not float8_e4m3fn")
            return None
        if prefix + ".input_scale" in tensors:
            raise unsupported(NAME, f"{prefix}.input_scale (static activation scales)")
        if len(has) != 1:
            raise ModelLoadError(f"{prefix}.weight is float8_e4m3fn with "
                                 f"{'no scale' if not has else 'two scales'} "
                                 "(weight_scale or weight_scale_inv)")
        if bool(((weight.view(torch.uint8) & 0x7F) == 0x7F).any()):
            raise ModelLoadError(f"{prefix}.weight holds NaN (e4m3 codes 0x7F / 0xFF)")
        n, k = weight.shape
        scale = tensors.get(has[0]).float()
        if not bool((scale.abs() < SCALE_LIMIT).all()):  # NaN compares false too
            raise ModelLoadError(f"{has[0]} holds a scale that is not finite or not below "
                                 "2^120")
        if has[0] == per_tensor:
            if self.block is not None:
                raise ModelLoadError(f"{per_tensor}: a per-tensor scale in a checkpoint of "
                                     f"weight_block_size {list(self.block)}")
            if scale.numel() != 1:
                raise ModelLoadError(f"{per_tensor} has shape {tuple(scale.shape)}, expected "
                                     "one value")
            return weight, scale.reshape(1, 1), (n, k)
        if self.block is None:
            raise ModelLoadError(f"{per_block}: block scales without weight_block_size")
        bn, bk = self.block
        want = (-(-n // bn), -(-k // bk))
        if tuple(scale.shape) != want:
            raise ModelLoadError(f"{per_block} has shape {tuple(scale.shape)}, expected {want} "
                                 f"for a [{n}, {k}] weight in blocks of {bn}x{bk}")
        # A block past the weight's edge scales what a block of the weight's size does: the
        # widened scales are sized by the clamped block, not by a config's 2^30.
        return weight, scale, (min(bn, n), min(bk, k))
