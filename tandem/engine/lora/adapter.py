"""A PEFT LoRA adapter directory, read strictly and laid out for the fused projections.

    adapter_config.json          peft_type LORA, r, lora_alpha, target_modules, use_rslora
    adapter_model.safetensors    base_model.model.model.layers.{i}.{self_attn|mlp}.{m}.lora_{A|B}.weight
                                 A: [r, in]   B: [out, r]        (no pickle: .bin is refused)

The engine fuses q/k/v into one projection and gate/up into another
(tandem/engine/models/layers), so an adapter is stored per fused group: the group's
sub-modules' A stacked and their B placed block-diagonally, the scaling (``alpha / r``, or
``alpha / sqrt(r)`` with rsLoRA) folded into B::

    qkv:  A = [A_q; A_k; A_v]  [3r, hidden]      B = diag(B_q, B_k, B_v)  [q + 2 kv, 3r]
          x @ A.T @ B.T = [x A_q^T B_q^T | x A_k^T B_k^T | x A_v^T B_v^T]

so one pair of matmuls gives the delta of the whole fused output (a sub-module the adapter
does not target has zero rows). Everything that could make the output quietly wrong is
refused with a message naming it: DoRA, fan_in_fan_out, trained biases, modules_to_save,
per-module rank or alpha patterns, targets other than q/k/v/o and gate/up/down, tensors
the engine would not consume, shapes that do not fit the base model, a rank above
``--max-lora-rank``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tandem.engine.models.arch import ModelArch

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# fused group -> its sub-modules, in the order their outputs are concatenated
GROUPS: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "o_proj": ("o_proj",),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "down_proj": ("down_proj",),
}
TARGETS = frozenset(m for subs in GROUPS.values() for m in subs)
_GROUP_OF = {m: g for g, subs in GROUPS.items() for m in subs}
_KEY = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\."
                  r"([a-z_]+)\.lora_([AB])\.weight$")
_MAX_CONFIG_BYTES = 1 << 20


class LoraError(ValueError):
    """An adapter directory that cannot be served as asked; the message says why."""


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    """One loaded adapter: per (layer, fused group) the stacked A ``[n r, in]`` and the
    scaled block-diagonal B ``[out, n r]``; ``digest`` names its exact bytes."""

    name: str
    path: str
    rank: int
    digest: str  # sha256 of the config and weights files, first 16 hex digits
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    @property
    def identity(self) -> str:
        """``name@digest``: what KV computed under this adapter is labelled with."""
        return f"{self.name}@{self.digest}"


def load_adapter(name: str, path: str | Path, arch: ModelArch, max_rank: int,
                 dtype: torch.dtype, device: torch.device) -> LoraAdapter:
    """Read and check the PEFT directory ``path`` against the base model. Raises LoraError."""
    config_bytes, weights_bytes = read_adapter_files(name, path)
    return parse_adapter(name, str(Path(path)), config_bytes, weights_bytes, arch, max_rank,
                         dtype, device)


def read_adapter_files(name: str, path: str | Path) -> tuple[bytes, bytes]:
    """The config and weights files of the PEFT directory ``path``. Raises LoraError."""
    root = Path(path)
    if not root.is_dir():
        raise LoraError(f"LoRA adapter {name!r}: {str(path)!r} is not a directory")
    config_path, weights_path = root / CONFIG_FILE, root / WEIGHTS_FILE
    if not config_path.is_file():
        raise LoraError(f"LoRA adapter {name!r}: no {CONFIG_FILE} in {str(path)!r}")
    if not weights_path.is_file():
        extra = " (adapter_model.bin is pickle: convert it to safetensors)" \
            if (root / "adapter_model.bin").exists() else ""
        raise LoraError(f"LoRA adapter {name!r}: no {WEIGHTS_FILE} in {str(path)!r}{extra}")
    if config_path.stat().st_size > _MAX_CONFIG_BYTES:
        raise LoraError(f"LoRA adapter {name!r}: {CONFIG_FILE} is over 1 MiB")
    return config_path.read_bytes(), weights_path.read_bytes()


def parse_adapter(name: str, path: str, config_bytes: bytes, weights_bytes: bytes,
                  arch: ModelArch, max_rank: int, dtype: torch.dtype, device: torch.device
                  ) -> LoraAdapter:
    """The adapter the files' bytes hold, checked against the base model (a tensor-parallel
    group's other ranks parse the bytes rank 0 read: tandem/engine/lora/manager.py).
    Raises LoraError."""
    try:
        config = json.loads(config_bytes)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise LoraError(f"LoRA adapter {name!r}: {CONFIG_FILE} is not JSON: {err}") from err
    rank, scaling, targets = _check_config(name, config, max_rank)
    tensors = _read_tensors(name, weights_bytes)
    digest = hashlib.sha256(config_bytes + b"\0" + weights_bytes).hexdigest()[:16]
    weights = _fuse(name, tensors, arch, rank, scaling, targets, dtype, device)
    return LoraAdapter(name, path, rank, digest, weights)


def _check_config(name: str, config: Any, max_rank: int) -> tuple[int, float, frozenset[str]]:
    """(rank, scaling, target modules) of a PEFT LoRA config; raises LoraError."""
    def refuse(why: str) -> LoraError:
        return LoraError(f"LoRA adapter {name!r}: {why}")

    if not isinstance(config, dict):
        raise refuse(f"{CONFIG_FILE} is not an object")
    if config.get("peft_type", "LORA") != "LORA":
        raise refuse(f"peft_type {config.get('peft_type')!r} is not LORA")
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise refuse(f"r must be a positive integer, got {rank!r}")
    if rank > max_rank:
        raise refuse(f"rank {rank} is above --max-lora-rank {max_rank}")
    alpha = config.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha):
        raise refuse(f"lora_alpha must be a number, got {alpha!r}")
    for key, ok in (("use_dora", False), ("fan_in_fan_out", False)):
        if bool(config.get(key, ok)) != ok:
            raise refuse(f"{key} is not supported")
    if config.get("bias", "none") != "none":
        raise refuse(f"bias {config.get('bias')!r} is not supported (only 'none')")
    for key in ("modules_to_save", "rank_pattern", "alpha_pattern", "layers_to_transform",
                "trainable_token_indices"):
        if config.get(key):
            raise refuse(f"{key} is not supported")
    raw = config.get("target_modules")
    if isinstance(raw, str):
        raise refuse(f"target_modules {raw!r}: give the module names as a list")
    if not isinstance(raw, list) or not raw or not all(isinstance(m, str) for m in raw):
        raise refuse("target_modules must be a non-empty list of module names")
    unknown = sorted(set(raw) - TARGETS)
    if unknown:
        raise refuse(f"target_modules {unknown} are not supported (only {sorted(TARGETS)})")
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return rank, float(scale), frozenset(raw)


def _read_tensors(name: str, data: bytes) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        return load(data)
    except (SafetensorError, ValueError, RuntimeError) as err:
        raise LoraError(f"LoRA adapter {name!r}: {WEIGHTS_FILE} is unreadable: {err}") from err


def module_dims(arch: ModelArch) -> dict[str, tuple[int, int]]:
    """(in, out) features of each target module of the base model."""
    h, q, kv, inter = (arch.hidden_size, arch.num_heads * arch.head_dim,
                       arch.num_kv_heads * arch.head_dim, arch.intermediate_size)
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}


def _fuse(name: str, tensors: dict[str, torch.Tensor], arch: ModelArch, rank: int,
          scaling: float, targets: frozenset[str], dtype: torch.dtype, device: torch.device,
          ) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    dims = module_dims(arch)
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        m = _KEY.match(key)
        if m is None or m.group(3) not in targets or int(m.group(1)) >= arch.num_layers:
            raise LoraError(f"LoRA adapter {name!r}: tensor {key!r} is not one this model "
                            "consumes")
        layer, module, ab = int(m.group(1)), m.group(3), m.group(4)
        fan_in, fan_out = dims[module]
        want = (rank, fan_in) if ab == "A" else (fan_out, rank)
        if tuple(t.shape) != want:
            raise LoraError(f"LoRA adapter {name!r}: {key} has shape {list(t.shape)}, the "
                            f"base model needs {list(want)}")
        if not torch.isfinite(t.float()).all():
            raise LoraError(f"LoRA adapter {name!r}: {key} holds NaN or infinity")
        pairs.setdefault((layer, module), {})[ab] = t.float()
    fused: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for (layer, module), ab in pairs.items():
        if set(ab) != {"A", "B"}:
            raise LoraError(f"LoRA adapter {name!r}: layer {layer} {module} has lora_A or "
                            "lora_B but not both")
    for layer in range(arch.num_layers):
        for group, subs in GROUPS.items():
            if not any((layer, s) in pairs for s in subs):
                continue
            fan_in = dims[subs[0]][0]
            outs = [dims[s][1] for s in subs]
            a = torch.zeros(len(subs) * rank, fan_in)
            b = torch.zeros(sum(outs), len(subs) * rank)
            row = 0
            for j, (sub, width) in enumerate(zip(subs, outs, strict=True)):
                if (layer, sub) in pairs:
                    a[j * rank:(j + 1) * rank] = pairs[(layer, sub)]["A"]
                    b[row:row + width, j * rank:(j + 1) * rank] = pairs[(layer, sub)]["B"] * scaling
                row += width
            fused[(layer, group)] = (a.to(device, dtype).contiguous(),
                                     b.to(device, dtype).contiguous())
    if not fused:
        raise LoraError(f"LoRA adapter {name!r}: {WEIGHTS_FILE} holds no LoRA weights")
    return fused
