"""Swap a loaded model's linear layers for quantized ones (``--quantization``).

    auto   the checkpoint's own format (the default): a GGUF's Q4_0/Q4_1/Q8_0 tensors run as
           they are stored (embedding and tied lm_head included); a plain checkpoint as is
    none   every weight dequantized (what the GGUF's converted directory holds)
    int8   every linear layer, lm_head included, per output channel
    int4   decoder linears in groups of 32 (a GGUF's own Q4_1 blocks where it has them, else
           min/max of the float weights); lm_head int8
    fp8    a checkpoint stored in FP8 (quant_method fp8: tandem/engine/quant/prequantized/
           fp8.py), kept in e4m3 for the native CPU kernels (PackedLinear; a model of any float dtype),
           dequantized at load elsewhere; refused for any other checkpoint (no online FP8
           quantization). auto loads such a checkpoint the same way; none dequantizes it.

On the CPU with the native kernels (fp32 activations), every quantized layer is a
PackedLinear: the kernels' layout is the one copy of its weights. Elsewhere (CUDA, no
compiler) the layers are Int4Linear/Int8Linear for torch's and Triton's kernels; ``auto`` then
keeps the Q4_1 blocks only.
"""

from __future__ import annotations

import ctypes
import gc
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from tandem.engine.errors import ModelLoadError
from tandem.engine.models.causal_lm import CausalLM
from tandem.engine.models.layers.moe_experts import Experts
from tandem.engine.models.linear import Linear
from tandem.engine.quant.int4 import GROUP_SIZE, Int4Linear
from tandem.engine.quant.int8 import Int8Linear
from tandem.engine.quant.prequantized.fp8 import NAME as FP8_NAME

if TYPE_CHECKING:
    from tandem.engine.quant.gguf_blocks import Blocks

log = logging.getLogger(__name__)

QUANT_METHODS = ("auto", "none", "int8", "int4", "fp8")


@dataclass(slots=True)
class QuantSummary:
    """What a model's weights are after :func:`quantize_model`."""

    method: str
    counts: Counter[str] = field(default_factory=Counter)  # format -> modules
    dequantized_from: str | None = None  # an FP8 checkpoint's format, now float weights

    @property
    def format(self) -> str:
        """One line for start-up logs and ``/v1/models``: ``Q4_1 x210 + Q8_0 x1``,
        ``fp8-block128x128 (dequantized at load)`` or ``unquantized``."""
        if self.dequantized_from is not None:
            return f"{self.dequantized_from} (dequantized at load)"
        if not self.counts:
            return "unquantized"
        return " + ".join(f"{k} x{v}" for k, v in sorted(self.counts.items(),
                                                          key=lambda kv: -kv[1]))


def quantize_model(
    model: CausalLM, method: str, gguf_path: Path | None = None, packed: bool = False,
    select: Callable[[dict[str, Blocks]], dict[str, Blocks]] | None = None,
) -> QuantSummary:
    """Replace the model's layers in place (see the module docstring); ``packed`` builds
    PackedLinear layers for the native CPU kernels. ``select`` cuts the GGUF's stored blocks
    as the model's layers were cut (one rank's shard: tandem/engine/parallel/shard.py)."""
    if method not in QUANT_METHODS:
        raise ValueError(f"quantization must be one of {QUANT_METHODS}, got {method!r}")
    summary = QuantSummary(method)
    source = model.dequantized_from  # an FP8 checkpoint's format, its weights now float
    # an FP8 checkpoint kept in e4m3 for the native kernels (load_model's native_layout)
    kept = getattr(model, "quant_format", "none").startswith(FP8_NAME + "-")
    if method == "fp8" and source is None and not kept:
        raise ModelLoadError(
            "--quantization fp8 loads checkpoints stored in FP8 (quantization_config."
            "quant_method fp8); this one is not (online FP8 quantization is not supported: "
            "use auto, int8 or int4)")
    if source is not None and method in ("auto", "none", "fp8"):
        summary.dequantized_from = source
        return summary
    if getattr(model, "quant_format", "none") != "none":
        return _prequantized(model, method, packed, summary)
    if method == "none" or (method == "auto" and gguf_path is None):
        return summary
    from tandem.engine.quant.gguf_blocks import read_blocks

    types = ("Q4_1",) if method == "int4" or not packed else ("Q4_0", "Q4_1", "Q8_0")
    stored = {}
    if gguf_path is not None and method in ("auto", "int4"):
        stored = read_blocks(gguf_path, model.arch, types, _held_experts(model))
        if select is not None:
            stored = select(stored)
    if method == "int4":  # the head stays int8 (a 49k-row int4 head costs too much quality)
        stored = {k: v for k, v in stored.items() if k.startswith("layers.")}
    if packed:
        from tandem.engine.native.packed_linear import PackedEmbedding, PackedLinear
    targets = [(n, m) for n, m in model.named_modules() if isinstance(m, Linear)]
    with torch.no_grad():
        if method == "auto" and packed and "embed_tokens" in stored:
            blocks = stored["embed_tokens"]
            table = _from_blocks(PackedLinear, blocks, None)
            tied = model.lm_head.weight is model.embed_tokens.weight
            model.embed_tokens = PackedEmbedding(table)
            summary.counts[f"{blocks.type} (embedding{', lm_head' if tied else ''})"] += 1
            if tied:
                model.lm_head = table
                targets = [(n, m) for n, m in targets if n != "lm_head"]
        for name, lin in targets:
            new: nn.Module | None = None
            if name in stored:
                blocks = stored[name]
                if packed:
                    new = _from_blocks(PackedLinear, blocks, lin.bias)
                else:
                    new = Int4Linear.from_q4_1(blocks.rows, lin.bias).to(lin.weight.device)
                summary.counts[blocks.type] += 1
            elif method == "int4" and name != "lm_head" and lin.in_features % GROUP_SIZE == 0:
                new = Int4Linear.from_float(lin.weight, lin.bias)
                summary.counts["int4"] += 1
            elif method in ("int4", "int8"):
                new = Int8Linear.from_float(lin.weight, lin.bias)
                summary.counts["int8"] += 1
            if new is None:
                continue
            if (new.out_features, new.in_features) != (lin.out_features, lin.in_features):
                # stored blocks not cut to this layer (a rank's shard): the kernels would
                # write past its output
                raise ValueError(f"{name}: stored {new.out_features} x {new.in_features} "
                                 f"for a {lin.out_features} x {lin.in_features} layer")
            if packed and new.in_features % 32 == 0:  # the kernels' groups of 32
                if isinstance(new, Int4Linear):
                    new = PackedLinear.from_int4(new)
                elif isinstance(new, Int8Linear):
                    new = PackedLinear.from_int8(new)
            set_module(model, name, new)
    _release_freed_memory()
    log.info("weights: %s (quantization=%s)", summary.format, method)
    return summary


def _prequantized(model: CausalLM, method: str, packed: bool,
                  summary: QuantSummary) -> QuantSummary:
    """A checkpoint stored quantized (AWQ, GPTQ, compressed-tensors; tandem/engine/quant/
    prequantized): ``auto`` keeps its layers (packed for the native kernels), ``none``
    dequantizes them, int4/int8 are refused (they would quantize twice)."""
    fmt = model.quant_format
    if method == "fp8":  # a checkpoint kept in FP8 (its PackedLinear layers): as auto
        method = "auto"
    if method in ("int4", "int8"):
        raise ModelLoadError(
            f"the checkpoint is already quantized ({fmt}); --quantization {method} would "
            "quantize it again: use auto (keep its format) or none (dequantize it)")
    if fmt.startswith(FP8_NAME + "-"):  # its linears built in the kernels' layout at load
        from tandem.engine.native.packed_linear import KIND_FP8, PackedLinear

        kept = sum(isinstance(m, PackedLinear) and m.kind == KIND_FP8 for m in model.modules())
        if kept:
            summary.counts[fmt] += kept
    elif packed:
        from tandem.engine.native.packed_linear import PackedLinear
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, Int4Linear | Int8Linear)]
    with torch.no_grad():
        for name, lin in layers:
            if method == "none":
                dense = Linear(lin.in_features, lin.out_features, bias=lin.bias is not None)
                dense.weight.copy_(lin.dequantize())
                if lin.bias is not None:
                    dense.bias.copy_(lin.bias)
                set_module(model, name, dense)
                continue
            if packed and lin.in_features % 32 == 0:
                new = PackedLinear.from_int4(lin) if isinstance(lin, Int4Linear) else \
                    PackedLinear.from_int8(lin)
                set_module(model, name, new)
            summary.counts[fmt] += 1
    if method == "none":
        model.quant_format = "none"
    _release_freed_memory()
    log.info("weights: %s (quantization=%s)", summary.format, method)
    return summary


def _from_blocks(cls, blocks, bias):  # (type[PackedLinear], Blocks, Tensor | None)
    build = {"Q4_0": cls.from_q4_0, "Q4_1": cls.from_q4_1, "Q8_0": cls.from_q8_0}[blocks.type]
    return build(blocks.rows, bias)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's weights as held (parameters and buffers, shared ones once; the
    RoPE tables left out)."""
    seen: set[int] = set()
    total = 0
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t is None or "cos_table" in name or "sin_table" in name:
            continue
        key = t.untyped_storage().data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total


def _release_freed_memory() -> None:
    """Hand the float weights the swap freed back to the OS (glibc keeps them otherwise)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def set_module(root: nn.Module, name: str, module: nn.Module) -> None:
    """Put ``module`` at dotted path ``name`` under ``root``."""
    parent_name, _, attr = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, attr, module)


def _held_experts(model: nn.Module) -> range | None:
    """The routed experts ``model`` holds (one rank's under expert parallelism), None: all."""
    for m in model.modules():
        if isinstance(m, Experts) and len(m.held) < len(m):
            return m.held
    return None
