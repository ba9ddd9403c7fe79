"""Swap a loaded model's linear layers for quantized ones (``--quantization``)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from engine.models.linear import Linear
from engine.models.llama import LlamaForCausalLM
from engine.quant.int4 import GROUP_SIZE, Int4Linear
from engine.quant.int8 import Int8Linear

log = logging.getLogger(__name__)

QUANT_METHODS = ("none", "int8", "int4")


def quantize_model(
    model: LlamaForCausalLM, method: str, gguf_path: Path | None = None
) -> dict[str, int]:
    """Replace the model's ``Linear`` layers in place; returns counts by kind.

    int8: every linear layer, lm_head included. int4: decoder linears in groups of 32 (from
    the GGUF's own Q4_1 blocks when ``gguf_path`` holds them, else by min/max quantization of
    the float weights); lm_head in int8. Layers whose input size is not a multiple of 32 stay
    int8 under int4."""
    if method not in QUANT_METHODS:
        raise ValueError(f"quantization must be one of {QUANT_METHODS}, got {method!r}")
    counts = {"int8": 0, "int4": 0, "int4_from_q4_1": 0}
    if method == "none":
        return counts
    q4_1: dict[str, object] = {}
    if method == "int4" and gguf_path is not None:
        from engine.quant.gguf_q4 import read_q4_1_layers

        q4_1 = read_q4_1_layers(gguf_path, model.arch)
    targets = [(n, m) for n, m in model.named_modules() if isinstance(m, Linear)]
    with torch.no_grad():
        for name, lin in targets:
            new: nn.Module
            if method == "int4" and name in q4_1:
                new = Int4Linear.from_q4_1(q4_1[name], lin.bias)
                new.to(lin.weight.device)
                counts["int4_from_q4_1"] += 1
            elif method == "int4" and name != "lm_head" and lin.in_features % GROUP_SIZE == 0:
                new = Int4Linear.from_float(lin.weight, lin.bias)
                counts["int4"] += 1
            else:
                new = Int8Linear.from_float(lin.weight, lin.bias)
                counts["int8"] += 1
            _set_module(model, name, new)
    log.info("quantized %s: %s", method, counts)
    return counts


def _set_module(root: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, attr = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, attr, module)
