"""Mixture-of-experts config fields and their reading into :class:`MoeArch`, shared by the MoE
families (mixtral.py, qwen2_moe.py, qwen3_moe.py; DeepSeek-V2/V3). Torch-free.

Which layers are sparse:

    Qwen2-MoE / Qwen3-MoE   layer i unless i in ``mlp_only_layers``, when
                            (i + 1) % ``decoder_sparse_step`` == 0
    DeepSeek-V2 / V3        layers >= ``first_k_dense_replace`` (``moe_layer_freq`` 1)
    Mixtral                 every layer

The other layers compute the dense MLP of ``intermediate_size``. Training-only fields (the
auxiliary loss, router logits output, router jitter) change nothing at inference: inert.
"""

from __future__ import annotations

from typing import Any

from tandem.engine.errors import UnsupportedConfigError
from tandem.engine.models.arch import MoeArch
from tandem.engine.models.spec import ConfigField, one_of


def _positive(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _layer_list(v: Any) -> bool:
    return v is None or (isinstance(v, list | tuple) and all(isinstance(i, int) for i in v))


# read only by training; a config holding any value serves the same forward
MOE_INERT_FIELDS = frozenset({
    "router_aux_loss_coef", "output_router_logits", "router_jitter_noise",  # Mixtral / Qwen
    "aux_loss_alpha", "seq_aux",  # DeepSeek
})

QWEN_MOE_FIELDS: tuple[ConfigField, ...] = (
    ConfigField("num_experts", _positive, "at least one expert"),
    ConfigField("num_experts_per_tok", _positive, "at least one expert per token"),
    ConfigField("moe_intermediate_size", _positive, "a positive expert width"),
    ConfigField("norm_topk_prob", default=False),
    ConfigField("decoder_sparse_step", _positive, "a positive step", default=1),
    ConfigField("mlp_only_layers", _layer_list, "a list of layer indices", default=()),
)


def _top_k(model_type: str, experts: int, k: int) -> int:
    if k > experts:
        raise UnsupportedConfigError(model_type, "num_experts_per_tok", k,
                                     f"at most num_experts ({experts})")
    return k


def mixtral_moe(config: Any) -> MoeArch:
    """Mixtral: every layer sparse, softmax over the top-k logits, ``intermediate_size``
    experts, no shared expert."""
    experts = config.num_local_experts
    return MoeArch(
        num_experts=experts,
        top_k=_top_k("mixtral", experts, config.num_experts_per_tok),
        expert_intermediate_size=config.intermediate_size,
        sparse_layers=tuple(range(config.num_hidden_layers)),
        routing="softmax", norm_topk_prob=True,
    )


def qwen_sparse_layers(config: Any) -> tuple[int, ...]:
    """The sparse layers of a Qwen2-MoE / Qwen3-MoE config (the module docstring's rule)."""
    step = getattr(config, "decoder_sparse_step", 1) or 1
    dense = set(getattr(config, "mlp_only_layers", None) or ())
    return tuple(i for i in range(config.num_hidden_layers)
                 if i not in dense and (i + 1) % step == 0)


def qwen_moe(config: Any, shared_expert: bool) -> MoeArch:
    """Qwen2-MoE (``shared_expert``: ``shared_expert_intermediate_size`` wide, behind a
    sigmoid gate) and Qwen3-MoE (none): softmax, top-k, renormalised when
    ``norm_topk_prob``."""
    experts = config.num_experts
    shared = config.shared_expert_intermediate_size if shared_expert else 0
    return MoeArch(
        num_experts=experts,
        top_k=_top_k(config.model_type, experts, config.num_experts_per_tok),
        expert_intermediate_size=config.moe_intermediate_size,
        sparse_layers=qwen_sparse_layers(config),
        routing="softmax", norm_topk_prob=bool(config.norm_topk_prob),
        shared_intermediate_size=shared, shared_expert_gate=shared_expert,
    )


def _groups_ok(v: Any) -> bool:
    return v is None or _positive(v)


# DeepSeek-V2 / V3 (their family modules add them to their fields). transformers' V2 router
# never renormalises, DeepSeek's own code does when norm_topk_prob: the two disagree, so a V2
# config asking for it is refused rather than computed one way silently.
DEEPSEEK_MOE_FIELDS: tuple[ConfigField, ...] = (
    ConfigField("n_routed_experts", _positive, "at least one routed expert"),
    ConfigField("num_experts_per_tok", _positive, "at least one expert per token"),
    ConfigField("moe_intermediate_size", _positive, "a positive expert width"),
    ConfigField("n_shared_experts", lambda v: v is None or (isinstance(v, int) and v >= 0),
                "a count of shared experts"),
    ConfigField("first_k_dense_replace", lambda v: v is None or (isinstance(v, int) and v >= 0),
                "a count of leading dense layers", default=0),
    ConfigField("moe_layer_freq", one_of(1, None), "every layer past the dense ones sparse",
                default=1),
    ConfigField("routed_scaling_factor", default=1.0),
    ConfigField("n_group", _groups_ok, "a positive group count"),
    ConfigField("topk_group", _groups_ok, "a positive group count"),
    ConfigField("norm_topk_prob", default=False),
    ConfigField("topk_method", one_of("greedy", "group_limited_greedy", "noaux_tc", None),
                "top-k methods: greedy, group_limited_greedy (V2), noaux_tc (V3)"),
    ConfigField("scoring_func", one_of("softmax", "sigmoid", None),
                "router scores: softmax (V2), sigmoid (V3)"),
)


def deepseek_moe(config: Any, version: int) -> MoeArch:
    """The MoE block of a DeepSeek-V2 (``version`` 2: softmax, ``topk_method``) or V3 (3:
    sigmoid, bias-corrected grouped choice) config; UnsupportedConfigError for a routing
    field that does not fit the version."""
    mt = config.model_type
    experts = config.n_routed_experts
    method = getattr(config, "topk_method", None) or ("greedy" if version == 2 else "noaux_tc")
    scoring = getattr(config, "scoring_func", None) or ("softmax" if version == 2 else "sigmoid")
    if version == 2 and (method not in ("greedy", "group_limited_greedy")
                         or scoring != "softmax"):
        raise UnsupportedConfigError(mt, "topk_method", method,
                                     "DeepSeek-V2 routes by softmax, greedy or grouped")
    if version == 3 and (method != "noaux_tc" or scoring != "sigmoid"):
        raise UnsupportedConfigError(mt, "topk_method", method,
                                     "DeepSeek-V3 routes by sigmoid scores (noaux_tc)")
    norm = bool(getattr(config, "norm_topk_prob", False))
    if version == 2 and norm:
        raise UnsupportedConfigError(mt, "norm_topk_prob", True,
                                     "transformers and DeepSeek's code differ on it for V2")
    grouped = method != "greedy"
    n_group = (getattr(config, "n_group", None) or 1) if grouped else 1
    topk_group = (getattr(config, "topk_group", None) or 1) if grouped else 1
    if experts % n_group or topk_group > n_group:
        raise UnsupportedConfigError(mt, "n_group", n_group,
                                     f"groups dividing {experts} experts, topk_group <= n_group")
    first_dense = getattr(config, "first_k_dense_replace", 0) or 0
    return MoeArch(
        num_experts=experts,
        top_k=_top_k(mt, experts, config.num_experts_per_tok),
        expert_intermediate_size=config.moe_intermediate_size,
        sparse_layers=tuple(range(first_dense, config.num_hidden_layers)),
        routing=f"deepseek_v{version}", norm_topk_prob=norm, topk_method=method,
        n_group=n_group, topk_group=topk_group,
        routed_scaling_factor=float(getattr(config, "routed_scaling_factor", 1.0) or 1.0),
        shared_intermediate_size=config.moe_intermediate_size * (
            getattr(config, "n_shared_experts", 0) or 0),
    )
