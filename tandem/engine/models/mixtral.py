"""Mixtral: Mistral's attention (no biases; a sliding window over every layer when
``sliding_window`` is set) with a mixture of experts in every layer: ``num_local_experts``
experts ``intermediate_size`` wide, each token routed to ``num_experts_per_tok`` of them by a
softmax over their router logits (tandem/engine/models/layers/moe.py). Checkpoints name the
block ``block_sparse_moe`` and an expert's linears ``w1`` (gate), ``w3`` (up), ``w2`` (down).
"""

from __future__ import annotations

from typing import Any

from tandem.engine.models.arch import Features
from tandem.engine.models.moe_config import MOE_INERT_FIELDS, mixtral_moe
from tandem.engine.models.spec import COMMON_FIELDS, ConfigField, FamilySpec
from tandem.engine.models.tensor_plan import MIXTRAL_NAMES, moe_plan


def _features(config: Any) -> Features:
    return Features(sliding_window=getattr(config, "sliding_window", None) or None,
                    moe=mixtral_moe(config))


SPEC = FamilySpec(
    model_type="mixtral",
    fields=COMMON_FIELDS + (
        ConfigField("sliding_window"),
        # one field under two names (transformers maps num_experts to num_local_experts)
        ConfigField("num_local_experts", lambda v: isinstance(v, int) and v > 0,
                    "at least one expert"),
        ConfigField("num_experts"),
        ConfigField("num_experts_per_tok", lambda v: isinstance(v, int) and v > 0,
                    "at least one expert per token"),
    ),
    features=_features,
    plan=moe_plan(MIXTRAL_NAMES),
    inert=MOE_INERT_FIELDS,
)
