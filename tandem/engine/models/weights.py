"""Build our model from a local checkpoint directory (config.json + *.safetensors).

Tensors are streamed from safetensors and copied into our (fused) parameters layer by layer,
with a progress bar; nothing is materialized twice. The linears of a pre-quantized checkpoint
(tandem/engine/quant/prequantized) become Int4Linear / Int8Linear built from the stored values.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn
from tqdm import tqdm

from tandem.engine.errors import ModelLoadError
from tandem.engine.models.arch import ModelArch, rotary_tables
from tandem.engine.models.linear import attach_fp32_shadows
from tandem.engine.models.llama import LlamaForCausalLM
from tandem.engine.quant.apply import set_module
from tandem.engine.quant.prequantized import (
    PrequantizedFormat,
    build_linear,
    concat_rows,
    detect_format,
)

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    """Map a dtype name from the config to a torch dtype."""
    return _DTYPES[name]


def load_hf_config(path: Path):  # -> transformers.PretrainedConfig
    """Read ``config.json`` with transformers (so RoPE parameters are normalized)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path, local_files_only=True)


def read_arch(path: Path) -> tuple[Any, ModelArch]:
    """The checkpoint's HF config and our architecture summary of it."""
    hf_config = load_hf_config(path)
    return hf_config, ModelArch.from_hf_config(hf_config)


def load_model(
    path: Path,
    dtype: torch.dtype,
    device: torch.device,
    max_positions: int,
    progress: bool = True,
    config: tuple[Any, ModelArch] | None = None,
    fp32_shadows: bool = True,
) -> tuple[LlamaForCausalLM, ModelArch]:
    """Instantiate our model for the checkpoint at ``path`` and load its weights.

    A pre-quantized checkpoint (AWQ, GPTQ, compressed-tensors: tandem/engine/quant/prequantized) gets
    its quantized linears as Int4Linear / Int8Linear built from the stored values, with no
    float copy of them ever made; ``model.quant_format`` names the format ("none" if dense).
    ``config`` is ``read_arch(path)``'s result when the caller already has it.
    ``fp32_shadows``: give a CPU bf16 model's linears their fp32 copies for the torch path
    (tandem/engine/models/linear.py); off where the native fused forward will serve it."""
    hf_config, arch = config or read_arch(path)
    fmt = detect_format(path)
    tensors = _open_tensors(path)
    cos, sin = rotary_tables(hf_config, max_positions)
    with torch.device("meta"):
        model = LlamaForCausalLM(arch, cos, sin)
    linears = _linears(arch)
    quantized = {name for name, parts, _ in linears if _stored_quantized(fmt, parts, tensors)}
    for name in quantized:  # a storage-less placeholder until the layer is built below
        set_module(model, name, nn.Identity())
    model = model.to_empty(device=device).to(dtype)
    model.cos_table = cos.to(device)
    model.sin_table = sin.to(device)
    if arch.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    load = _LinearLoader(model, tensors, fmt, quantized, dtype, device)
    with torch.no_grad():
        _copy_weights(model, arch, tensors, progress, load)
    model.eval()
    if quantized:
        model.quant_format = fmt.label
        log.info("pre-quantized checkpoint %s: %d of %d linear layers quantized (%d decoder "
                 "layers, lm_head %s)", fmt.label, len(quantized), len(linears),
                 arch.num_layers, "quantized" if "lm_head" in quantized else "not quantized")
    if fp32_shadows and device.type == "cpu" and dtype == torch.bfloat16:
        attach_fp32_shadows(model)
    return model, arch


class _Tensors:
    """Name -> tensor lookup across the shards of a safetensors checkpoint (files kept open)."""

    def __init__(self, files: list[Path]) -> None:
        self._handles = [safe_open(str(f), framework="pt") for f in files]
        self._where: dict[str, Any] = {}
        for h in self._handles:
            for k in h.keys():
                self._where[k] = h

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise ModelLoadError(f"checkpoint lacks tensor {name!r}")
        return self._where[name].get_tensor(name)


def _open_tensors(path: Path) -> _Tensors:
    files = sorted(path.glob("*.safetensors"))
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = set(json.loads(index.read_text())["weight_map"].values())
        files = [path / n for n in sorted(names)]
    if not files:
        raise ModelLoadError(f"no safetensors weights in {path}")
    return _Tensors(files)


# (our module, its checkpoint linears in row order, whether it has a bias)
_Linear = tuple[str, list[str], bool]


def _layer_linears(arch: ModelArch, i: int) -> list[_Linear]:
    p = f"model.layers.{i}."
    return [
        (f"layers.{i}.self_attn.qkv_proj", [p + f"self_attn.{n}_proj" for n in "qkv"],
         arch.qkv_bias),
        (f"layers.{i}.self_attn.o_proj", [p + "self_attn.o_proj"], False),
        (f"layers.{i}.mlp.gate_up_proj", [p + "mlp.gate_proj", p + "mlp.up_proj"], False),
        (f"layers.{i}.mlp.down_proj", [p + "mlp.down_proj"], False),
    ]


def _head(arch: ModelArch) -> list[_Linear]:
    return [] if arch.tie_word_embeddings else [("lm_head", ["lm_head"], False)]


def _linears(arch: ModelArch) -> list[_Linear]:
    """Every linear layer of our model and the checkpoint linears it fuses."""
    return _head(arch) + [lin for i in range(arch.num_layers) for lin in _layer_linears(arch, i)]


def _stored_quantized(fmt: PrequantizedFormat, parts: list[str], t: _Tensors) -> bool:
    flags = {fmt.is_quantized(part, t) for part in parts}
    if len(flags) > 1:
        raise ModelLoadError(f"{', '.join(parts)} are fused but only some are quantized")
    return flags.pop()


class _LinearLoader:
    """Fills one linear layer of the model: float weights copied in place, quantized ones
    built from the checkpoint's values (replacing the placeholder)."""

    def __init__(self, model: LlamaForCausalLM, t: _Tensors, fmt: PrequantizedFormat,
                 quantized: set[str], dtype: torch.dtype, device: torch.device) -> None:
        self.model, self.t, self.fmt, self.quantized = model, t, fmt, quantized
        self.dtype, self.device = dtype, device

    def __call__(self, linear: _Linear) -> None:
        name, parts, has_bias = linear
        t = self.t
        bias = torch.cat([t.get(part + ".bias") for part in parts]) if has_bias else None
        if name in self.quantized:
            weight = concat_rows([self.fmt.unpack(part, t) for part in parts])
            b = None if bias is None else bias.to(self.dtype)
            set_module(self.model, name, build_linear(weight, b, self.device))
            return
        lin = self.model.get_submodule(name)
        lin.weight.copy_(torch.cat([t.get(part + ".weight") for part in parts], dim=0))
        if bias is not None:
            lin.bias.copy_(bias)


def _copy_weights(
    model: LlamaForCausalLM, arch: ModelArch, t: _Tensors, progress: bool, load: _LinearLoader
) -> None:
    model.embed_tokens.weight.copy_(t.get("model.embed_tokens.weight"))
    model.norm.weight.copy_(t.get("model.norm.weight"))
    for linear in _head(arch):
        load(linear)
    layers = tqdm(
        range(arch.num_layers), desc="Loading weights", unit="layer", disable=not progress
    )
    for i in layers:
        p = f"model.layers.{i}."
        layer = model.layers[i]
        for linear in _layer_linears(arch, i):
            load(linear)
        attn = layer.self_attn
        if attn.q_norm is not None and attn.k_norm is not None:
            attn.q_norm.weight.copy_(t.get(p + "self_attn.q_norm.weight"))
            attn.k_norm.weight.copy_(t.get(p + "self_attn.k_norm.weight"))
        layer.input_layernorm.weight.copy_(t.get(p + "input_layernorm.weight"))
        layer.post_attention_layernorm.weight.copy_(t.get(p + "post_attention_layernorm.weight"))
