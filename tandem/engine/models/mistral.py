"""Mistral: Llama without biases, with a sliding window over every layer when
``sliding_window`` is set (Mistral-7B-v0.1: 4096; later releases: none)."""

from __future__ import annotations

from typing import Any

from tandem.engine.models.arch import Features
from tandem.engine.models.spec import COMMON_FIELDS, ConfigField, FamilySpec


def _features(config: Any) -> Features:
    return Features(sliding_window=getattr(config, "sliding_window", None) or None)


SPEC = FamilySpec(
    model_type="mistral",
    fields=COMMON_FIELDS + (ConfigField("sliding_window"),),
    features=_features,
    gguf_architectures=("mistral",),
)
