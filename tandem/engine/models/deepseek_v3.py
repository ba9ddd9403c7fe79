"""DeepSeek-V3 (and R1, and their MLA distills): DeepSeek-V2's multi-head latent attention
(deepseek_v2.py) with q-LoRA as the released checkpoints have it, and ``rope_interleave``
choosing RoPE on adjacent pairs (true, the default) or on halves; the MLP never has a bias.

The multi-token-prediction layers (``num_nextn_predict_layers``) are not part of the forward
transformers computes, nor of ours. Layers from ``first_k_dense_replace`` on are MoE (grouped
sigmoid routing): refused by name until the MoE block is wired (deepseek_v2.refuse_moe_layers).
"""

from __future__ import annotations

from typing import Any

from tandem.engine.models.arch import Features
from tandem.engine.models.deepseek_v2 import (
    MLA_FIELDS,
    MLA_FORWARD,
    MOE_FIELDS,
    mla_dims,
    refuse_moe_layers,
)
from tandem.engine.models.spec import COMMON_FIELDS, ConfigField, FamilySpec
from tandem.engine.models.tensor_plan import mla_plan


def _features(config: Any) -> Features:
    refuse_moe_layers(config)
    interleave = bool(getattr(config, "rope_interleave", True))
    return Features(o_bias=bool(getattr(config, "attention_bias", False)),
                    mla=mla_dims(config, rope_interleave=interleave))


SPEC = FamilySpec(
    model_type="deepseek_v3",
    fields=COMMON_FIELDS + MLA_FIELDS + MOE_FIELDS + (
        ConfigField("rope_interleave", default=True),
        ConfigField("num_local_experts"),  # transformers' alias of n_routed_experts
    ),
    features=_features,
    forward=MLA_FORWARD,
    plan=mla_plan,
    inert=frozenset({"qk_head_dim", "num_nextn_predict_layers", "num_mtp_layers"}),
)
