"""DeepSeek-V3 (and R1, and their MLA distills): DeepSeek-V2's multi-head latent attention
(deepseek_v2.py) with q-LoRA as the released checkpoints have it, and ``rope_interleave``
choosing RoPE on adjacent pairs (true, the default) or on halves; the MLP never has a bias.

Layers from ``first_k_dense_replace`` on are mixture-of-experts (tandem/engine/models/layers/
moe.py): sigmoid scores, experts chosen on scores + the router's ``e_score_correction_bias``
within the best ``topk_group`` of ``n_group`` groups, weights the chosen raw scores
(renormalised when ``norm_topk_prob``) x ``routed_scaling_factor``, plus the shared experts.

The multi-token-prediction layers (``num_nextn_predict_layers`` of them, stored after the last
decoder layer as ``model.layers.<num_hidden_layers + j>.*``) are not part of the forward
transformers computes, nor of ours: the loader skips their tensors, saying so (``mtp_layers``).
"""

from __future__ import annotations

from typing import Any

from tandem.engine.models.arch import Features
from tandem.engine.models.deepseek_v2 import (
    DEEPSEEK_INERT_FIELDS,
    MLA_FIELDS,
    MLA_FORWARD,
    mla_dims,
    mla_moe_plan,
    moe_arch,
)
from tandem.engine.models.moe_config import DEEPSEEK_MOE_FIELDS
from tandem.engine.models.spec import COMMON_FIELDS, ConfigField, ExtraLayers, FamilySpec

MAX_MTP_LAYERS = 16  # released checkpoints carry one


def _features(config: Any) -> Features:
    interleave = bool(getattr(config, "rope_interleave", True))
    return Features(o_bias=bool(getattr(config, "attention_bias", False)),
                    mla=mla_dims(config, rope_interleave=interleave),
                    moe=moe_arch(config, 3))


def mtp_layers(config: Any) -> ExtraLayers | None:
    """The multi-token-prediction layers a checkpoint of ``config`` may carry."""
    first, count = config.num_hidden_layers, getattr(config, "num_nextn_predict_layers", 0) or 0
    if not count:
        return None
    return ExtraLayers(range(first, first + count),
                       f"multi-token-prediction layers (num_nextn_predict_layers={count}), "
                       "not used for plain decoding")


SPEC = FamilySpec(
    model_type="deepseek_v3",
    fields=COMMON_FIELDS + MLA_FIELDS + DEEPSEEK_MOE_FIELDS + (
        ConfigField("rope_interleave", default=True),
        ConfigField("num_local_experts"),  # transformers' alias of n_routed_experts
        # (num_mtp_layers: transformers' alias) layers the loader skips
        ConfigField("num_nextn_predict_layers",
                    lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)
                                            and 0 <= v <= MAX_MTP_LAYERS),
                    f"0 to {MAX_MTP_LAYERS} multi-token-prediction layers", default=0),
        ConfigField("num_mtp_layers"),
    ),
    features=_features,
    forward=MLA_FORWARD,
    plan=mla_moe_plan,
    extra_layers=mtp_layers,
    inert=DEEPSEEK_INERT_FIELDS,
)
