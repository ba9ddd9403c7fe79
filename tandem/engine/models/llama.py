"""Llama (and the checkpoints that reuse its config: SmolLM, Llama-3, TinyLlama, ...).

``attention_bias`` puts a bias on q, k, v *and* o; ``mlp_bias`` on gate, up and down (as
transformers' LlamaAttention / LlamaMLP build them). RoPE scaling: linear, llama3, yarn.
"""

from __future__ import annotations

from typing import Any

from tandem.engine.models.arch import Features
from tandem.engine.models.spec import COMMON_FIELDS, ConfigField, FamilySpec


def _features(config: Any) -> Features:
    attn = bool(getattr(config, "attention_bias", False))
    return Features(qkv_bias=attn, o_bias=attn, mlp_bias=bool(getattr(config, "mlp_bias", False)))


SPEC = FamilySpec(
    model_type="llama",
    fields=COMMON_FIELDS + (ConfigField("attention_bias", default=False),
                            ConfigField("mlp_bias", default=False)),
    features=_features,
    gguf_architectures=("llama",),
)
