"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention (biases on q, k and v unless
``qkv_bias`` is off; sliding layers by ``layer_types``) with a mixture of experts on the sparse
layers (``decoder_sparse_step``, ``mlp_only_layers``; the others a dense MLP of
``intermediate_size``): ``num_experts`` experts ``moe_intermediate_size`` wide, softmax top-k
(renormalised when ``norm_topk_prob``), plus a shared expert
``shared_expert_intermediate_size`` wide scaled by ``sigmoid(x . shared_expert_gate)``
(tandem/engine/models/layers/moe.py)."""

from __future__ import annotations

from typing import Any

from tandem.engine.models.arch import Features
from tandem.engine.models.moe_config import MOE_INERT_FIELDS, QWEN_MOE_FIELDS, qwen_moe
from tandem.engine.models.qwen2 import SLIDING_FIELDS, layer_types, window
from tandem.engine.models.spec import COMMON_FIELDS, ConfigField, FamilySpec
from tandem.engine.models.tensor_plan import QWEN_MOE_NAMES, moe_plan


def _features(config: Any) -> Features:
    return Features(qkv_bias=bool(getattr(config, "qkv_bias", True)),
                    sliding_window=window(config), layer_types=layer_types(config),
                    moe=qwen_moe(config, shared_expert=True))


SPEC = FamilySpec(
    model_type="qwen2_moe",
    fields=COMMON_FIELDS + SLIDING_FIELDS + QWEN_MOE_FIELDS + (
        ConfigField("qkv_bias", default=True),
        ConfigField("shared_expert_intermediate_size", lambda v: isinstance(v, int) and v > 0,
                    "a shared expert (the gate scales one)"),
    ),
    features=_features,
    gguf_architectures=("qwen2moe",),  # converted by tandem/engine/gguf_moe.py
    plan=moe_plan(QWEN_MOE_NAMES),
    inert=MOE_INERT_FIELDS,
)
