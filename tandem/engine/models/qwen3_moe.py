"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (per-head q/k norms,
``head_dim`` decoupled, ``attention_bias`` on q, k, v and o; with ``use_sliding_window`` every
layer slides) with a mixture of experts on the sparse layers (``decoder_sparse_step``,
``mlp_only_layers``; the others a dense MLP of ``intermediate_size``): ``num_experts`` experts
``moe_intermediate_size`` wide, softmax top-k renormalised when ``norm_topk_prob``, no shared
expert (tandem/engine/models/layers/moe.py)."""

from __future__ import annotations

from typing import Any

from tandem.engine.models.arch import Features
from tandem.engine.models.moe_config import MOE_INERT_FIELDS, QWEN_MOE_FIELDS, qwen_moe
from tandem.engine.models.spec import COMMON_FIELDS, ConfigField, FamilySpec
from tandem.engine.models.tensor_plan import QWEN_MOE_NAMES, moe_plan


def _features(config: Any) -> Features:
    attn = bool(getattr(config, "attention_bias", False))
    # transformers keeps sliding_window only under use_sliding_window, for every layer
    return Features(qkv_bias=attn, o_bias=attn, qk_norm=True,
                    sliding_window=getattr(config, "sliding_window", None) or None,
                    moe=qwen_moe(config, shared_expert=False))


SPEC = FamilySpec(
    model_type="qwen3_moe",
    fields=COMMON_FIELDS + QWEN_MOE_FIELDS + (
        ConfigField("attention_bias", default=False),
        ConfigField("use_sliding_window", default=False),
        ConfigField("sliding_window"),
        ConfigField("num_local_experts"),  # num_experts under transformers' other name
    ),
    features=_features,
    gguf_architectures=("qwen3moe",),  # converted by tandem/engine/gguf_moe.py
    plan=moe_plan(QWEN_MOE_NAMES),
    inert=MOE_INERT_FIELDS,
)
