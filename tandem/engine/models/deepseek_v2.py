"""DeepSeek-V2 (V2-Lite, V2.5, V2-Chat): multi-head latent attention (arch.MlaDims, computed
by mla_lm.py over the latent KV cache), RoPE on adjacent pairs, biases on the latent
projections and o_proj with ``attention_bias``, on the MLP with ``mlp_bias``.

The softmax scale is ``qk_head_dim ** -0.5``, times ``mscale(factor, mscale_all_dim) ** 2``
under a non-default RoPE (transformers' ``yarn_apply_mscale``; yarn's own attention factor
scales the rotated dims through the RoPE tables).

Layers from ``first_k_dense_replace`` on are mixture-of-experts: not computed yet, so a
config with any is refused by name (``refuse_moe_layers``); the MoE fields are inert for every
config that is accepted (no layer reads them).
"""

from __future__ import annotations

import math
from typing import Any

from tandem.engine.errors import UnsupportedConfigError
from tandem.engine.models.arch import Features, MlaDims
from tandem.engine.models.spec import COMMON_FIELDS, ConfigField, FamilySpec, rope_parameters
from tandem.engine.models.tensor_plan import mla_plan

MLA_FORWARD = "tandem.engine.models.mla_lm:MlaCausalLM"

MLA_FIELDS = (
    ConfigField("kv_lora_rank"), ConfigField("q_lora_rank"), ConfigField("qk_rope_head_dim"),
    ConfigField("qk_nope_head_dim"), ConfigField("v_head_dim"),
    ConfigField("attention_bias", default=False),
)

# Read by DeepSeek's MoE layers only, which refuse_moe_layers keeps out: inert until then.
MOE_FIELDS = tuple(ConfigField(name) for name in (
    "first_k_dense_replace", "n_routed_experts", "moe_intermediate_size", "n_shared_experts",
    "routed_scaling_factor", "topk_method", "n_group", "topk_group", "num_experts_per_tok",
    "norm_topk_prob", "scoring_func", "moe_layer_freq", "ep_size", "aux_loss_alpha",
    "seq_aux", "output_router_logits",
))


def moe_layers(config: Any) -> range:
    """The layers transformers builds as mixture-of-experts: every one from
    first_k_dense_replace on (whatever n_routed_experts says: with none routed, the shared
    experts still replace the dense MLP there)."""
    first = getattr(config, "first_k_dense_replace", None) or 0
    return range(first, config.num_hidden_layers)


def refuse_moe_layers(config: Any) -> None:
    """UnsupportedConfigError naming first_k_dense_replace when any layer would be MoE."""
    moe = moe_layers(config)
    if moe:
        raise UnsupportedConfigError(
            config.model_type, "first_k_dense_replace", getattr(config, "first_k_dense_replace",
                                                                None),
            f"layers {moe.start}..{moe.stop - 1} of {config.num_hidden_layers} would be "
            f"mixture-of-experts (n_routed_experts={config.n_routed_experts}); DeepSeek's MoE "
            "layers are not computed yet, only configs whose every layer is dense")


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
    refuse_moe_layers(config)
    return Features(o_bias=bool(getattr(config, "attention_bias", False)),
                    mlp_bias=bool(getattr(config, "mlp_bias", False)),
                    mla=mla_dims(config, rope_interleave=True))  # V2 always rotates pairs


SPEC = FamilySpec(
    model_type="deepseek_v2",
    fields=COMMON_FIELDS + MLA_FIELDS + MOE_FIELDS + (
        ConfigField("mlp_bias", default=False),
        ConfigField("num_experts"),  # transformers' alias of n_routed_experts
    ),
    features=_features,
    forward=MLA_FORWARD,
    plan=mla_plan,
    inert=frozenset({"qk_head_dim"}),  # derived by transformers' config
)
