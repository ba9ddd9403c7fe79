"""Build our model from a local checkpoint directory (config.json + *.safetensors).

Tensors are streamed from safetensors and copied into our (fused) parameters layer by layer,
with a progress bar; nothing is materialized twice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from tqdm import tqdm

from engine.errors import ModelLoadError
from engine.models.arch import ModelArch, rotary_tables
from engine.models.linear import attach_fp32_shadows
from engine.models.llama import LlamaForCausalLM
from engine.platform import cpu_has_native_bf16

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
) -> tuple[LlamaForCausalLM, ModelArch]:
    """Instantiate our model for the checkpoint at ``path`` and load its weights.

    ``config`` is ``read_arch(path)``'s result when the caller already has it."""
    hf_config, arch = config or read_arch(path)
    cos, sin = rotary_tables(hf_config, max_positions)
    with torch.device("meta"):
        model = LlamaForCausalLM(arch, cos, sin)
    model = model.to_empty(device=device).to(dtype)
    model.cos_table = cos.to(device)
    model.sin_table = sin.to(device)
    if arch.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    tensors = _open_tensors(path)
    with torch.no_grad():
        _copy_weights(model, arch, tensors, progress)
    model.eval()
    if device.type == "cpu" and dtype == torch.bfloat16 and not cpu_has_native_bf16():
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


def _copy_weights(model: LlamaForCausalLM, arch: ModelArch, t: _Tensors, progress: bool) -> None:
    model.embed_tokens.weight.copy_(t.get("model.embed_tokens.weight"))
    model.norm.weight.copy_(t.get("model.norm.weight"))
    if not arch.tie_word_embeddings:
        model.lm_head.weight.copy_(t.get("lm_head.weight"))
    layers = tqdm(
        range(arch.num_layers), desc="Loading weights", unit="layer", disable=not progress
    )
    for i in layers:
        p = f"model.layers.{i}."
        layer = model.layers[i]
        attn = layer.self_attn
        qkv = [t.get(p + f"self_attn.{n}_proj.weight") for n in "qkv"]
        attn.qkv_proj.weight.copy_(torch.cat(qkv, dim=0))
        if arch.qkv_bias:
            bias = [t.get(p + f"self_attn.{n}_proj.bias") for n in "qkv"]
            attn.qkv_proj.bias.copy_(torch.cat(bias, dim=0))
        attn.o_proj.weight.copy_(t.get(p + "self_attn.o_proj.weight"))
        if attn.q_norm is not None and attn.k_norm is not None:
            attn.q_norm.weight.copy_(t.get(p + "self_attn.q_norm.weight"))
            attn.k_norm.weight.copy_(t.get(p + "self_attn.k_norm.weight"))
        gate_up = [t.get(p + "mlp.gate_proj.weight"), t.get(p + "mlp.up_proj.weight")]
        layer.mlp.gate_up_proj.weight.copy_(torch.cat(gate_up, dim=0))
        layer.mlp.down_proj.weight.copy_(t.get(p + "mlp.down_proj.weight"))
        layer.input_layernorm.weight.copy_(t.get(p + "input_layernorm.weight"))
        layer.post_attention_layernorm.weight.copy_(t.get(p + "post_attention_layernorm.weight"))
