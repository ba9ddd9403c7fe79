"""Qwen3 (dense): per-head RMSNorm on q and k before RoPE, ``head_dim`` decoupled from
hidden / heads, ``attention_bias`` on q, k, v and o; sliding layers as Qwen2."""

from __future__ import annotations

from typing import Any

from tandem.engine.models.arch import Features
from tandem.engine.models.qwen2 import SLIDING_FIELDS, layer_types, window
from tandem.engine.models.spec import COMMON_FIELDS, ConfigField, FamilySpec


def _features(config: Any) -> Features:
    attn = bool(getattr(config, "attention_bias", False))
    return Features(qkv_bias=attn, o_bias=attn, qk_norm=True, sliding_window=window(config),
                    layer_types=layer_types(config))


SPEC = FamilySpec(
    model_type="qwen3",
    fields=COMMON_FIELDS + SLIDING_FIELDS + (ConfigField("attention_bias", default=False),),
    features=_features,
    gguf_architectures=("qwen3",),
)
