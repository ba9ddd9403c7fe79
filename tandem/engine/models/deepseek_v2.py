"""DeepSeek-V2 (V2-Lite, V2.5, V2-Chat): multi-head latent attention (arch.MlaDims, computed
by mla_lm.py over the latent KV cache), RoPE on adjacent pairs, biases on the latent
projections and o_proj with ``attention_bias``, on the MLP with ``mlp_bias``.

The softmax scale is ``qk_head_dim ** -0.5``, times ``mscale(factor, mscale_all_dim) ** 2``
under a non-default RoPE (transformers' ``yarn_apply_mscale``; yarn's own attention factor
scales the rotated dims through the RoPE tables).

Layers from ``first_k_dense_replace`` on are mixture-of-experts (tandem/engine/models/layers/
moe.py; ``moe_layer_freq`` other than 1 refused): ``n_routed_experts`` experts
``moe_intermediate_size`` wide, softmax scores, greedy or group-limited greedy top-k
(``topk_method``, ``n_group``, ``topk_group``), weights x ``routed_scaling_factor``, plus
``n_shared_experts`` shared experts always on (biased with ``mlp_bias`` as the dense MLP).
``norm_topk_prob`` is refused: transformers' V2 never renormalises, DeepSeek's code does.
"""

from __future__ import annotations

import math
from typing import Any

from tandem.engine.models.arch import Features, MlaDims, ModelArch, MoeArch
from tandem.engine.models.moe_config import DEEPSEEK_MOE_FIELDS, MOE_INERT_FIELDS, deepseek_moe
from tandem.engine.models.spec import COMMON_FIELDS, ConfigField, FamilySpec, rope_parameters
from tandem.engine.models.tensor_plan import DEEPSEEK_MOE_NAMES, WeightPlan, mla_plan, with_moe

MLA_FORWARD = "tandem.engine.models.mla_lm:MlaCausalLM"

MLA_FIELDS = (
    ConfigField("kv_lora_rank"), ConfigField("q_lora_rank"), ConfigField("qk_rope_head_dim"),
    ConfigField("qk_nope_head_dim"), ConfigField("v_head_dim"),
    ConfigField("attention_bias", default=False),
)

# ep_size: how DeepSeek's own code splits experts over ranks, the same forward at any value
DEEPSEEK_INERT_FIELDS = MOE_INERT_FIELDS | {"qk_head_dim", "ep_size"}  # qk_head_dim: derived


def moe_arch(config: Any, version: int) -> MoeArch | None:
    """The MoE block of the layers from ``first_k_dense_replace`` on (moe_config.deepseek_moe:
    its routing refusals), or None when every layer is dense."""
    moe = deepseek_moe(config, version)
    return moe if moe.sparse_layers else None


def softmax_scale(config: Any, qk_head_dim: int) -> float:
    """transformers' ``yarn_apply_mscale(rope_parameters, qk_head_dim ** -0.5)``."""
    scale = qk_head_dim**-0.5
    params = rope_parameters(config)
    all_dim = params.get("mscale_all_dim", 0)
    if params.get("rope_type", "default") != "default" and all_dim:
        factor = params["factor"]
        mscale = 0.1 * all_dim * math.log(factor) + 1.0 if factor > 1 else 1.0
        scale *= mscale * mscale
    return scale


def mla_dims(config: Any, rope_interleave: bool) -> MlaDims:
    """The MLA shape of a DeepSeek config."""
    qk = config.qk_nope_head_dim + config.qk_rope_head_dim
    return MlaDims(
        kv_lora_rank=config.kv_lora_rank, qk_rope_head_dim=config.qk_rope_head_dim,
        qk_nope_head_dim=config.qk_nope_head_dim, v_head_dim=config.v_head_dim,
        q_lora_rank=config.q_lora_rank or None, softmax_scale=softmax_scale(config, qk),
        rope_interleave=rope_interleave,
        latent_bias=bool(getattr(config, "attention_bias", False)),
    )


def _features(config: Any) -> Features:
    return Features(o_bias=bool(getattr(config, "attention_bias", False)),
                    mlp_bias=bool(getattr(config, "mlp_bias", False)),
                    mla=mla_dims(config, rope_interleave=True),  # V2 always rotates pairs
                    moe=moe_arch(config, 2))


def mla_moe_plan(arch: ModelArch) -> WeightPlan:
    """MLA's projections in every layer, the MoE block's tensors in the sparse ones."""
    return with_moe(mla_plan(arch), arch, DEEPSEEK_MOE_NAMES)


SPEC = FamilySpec(
    model_type="deepseek_v2",
    fields=COMMON_FIELDS + MLA_FIELDS + DEEPSEEK_MOE_FIELDS + (
        ConfigField("mlp_bias", default=False),
        ConfigField("num_experts"),  # transformers' alias of n_routed_experts
    ),
    features=_features,
    forward=MLA_FORWARD,
    # V2 and V3 alike: the file's router says which (tandem/engine/gguf_deepseek.py)
    gguf_architectures=("deepseek2",),
    plan=mla_moe_plan,
    inert=DEEPSEEK_INERT_FIELDS,
)
