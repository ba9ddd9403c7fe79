"""The model families this engine computes, by config ``model_type`` and GGUF architecture.

Adding a family is adding its module (a ``SPEC``: tandem/engine/models/spec.py) and a line in
``_SPECS``. Torch-free: a checkpoint is refused here before anything heavy loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tandem.engine.errors import ModelLoadError, UnsupportedModelError
from tandem.engine.models import (
    deepseek_v2,
    deepseek_v3,
    llama,
    mistral,
    mixtral,
    qwen2,
    qwen2_moe,
    qwen3,
    qwen3_moe,
)
from tandem.engine.models.arch import ModelArch
from tandem.engine.models.spec import FamilySpec

_SPECS = (llama.SPEC, mistral.SPEC, qwen2.SPEC, qwen3.SPEC,
          mixtral.SPEC, qwen2_moe.SPEC, qwen3_moe.SPEC,  # mixture of experts
          deepseek_v2.SPEC, deepseek_v3.SPEC)  # latent attention
FAMILIES: dict[str, FamilySpec] = {s.model_type: s for s in _SPECS}
GGUF_ARCHITECTURES: dict[str, FamilySpec] = {a: s for s in _SPECS for a in s.gguf_architectures}


def supported_model_types() -> tuple[str, ...]:
    """Every config ``model_type`` a checkpoint may have."""
    return tuple(FAMILIES)


def family(model_type: str) -> FamilySpec:
    """The family of a config's ``model_type``; UnsupportedModelError for any other."""
    spec = FAMILIES.get(model_type)
    if spec is None:
        raise UnsupportedModelError("model_type", model_type, supported_model_types())
    return spec


def gguf_family(architecture: str, experts: int = 0) -> FamilySpec:
    """The family of a GGUF's ``general.architecture`` (``experts``: its
    ``<architecture>.expert_count``); UnsupportedModelError for any other. llama.cpp writes
    Mixtral as ``llama`` with experts: that is Mixtral here."""
    if architecture == "llama" and experts > 0:
        return mixtral.SPEC
    spec = GGUF_ARCHITECTURES.get(architecture)
    if spec is None:
        raise UnsupportedModelError("GGUF architecture", architecture, tuple(GGUF_ARCHITECTURES))
    return spec


def read_config_json(path: Path) -> dict[str, Any]:
    """A checkpoint directory's config.json as written (ModelLoadError when unreadable)."""
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {path / 'config.json'}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{path / 'config.json'} is not a JSON object")
    return raw


def checkpoint_family(path: Path) -> FamilySpec:
    """The family of the checkpoint at ``path``, from config.json alone (no transformers)."""
    model_type = read_config_json(path).get("model_type")
    return family(str(model_type) if model_type is not None else "(none)")


def arch_of(hf_config: Any, raw: dict[str, Any] | None = None) -> ModelArch:
    """Check a transformers config against its family's spec and summarize it; ``raw``
    (config.json's keys) lets unknown keys be logged."""
    spec = family(hf_config.model_type)
    spec.check(hf_config, set(raw) if raw is not None else None)
    return spec.arch(hf_config)
