"""What a model family declares: the config fields it honours, the values it refuses, the
tensors it consumes and the forward that computes it. Torch-free.

    config.json --model_type--> FamilySpec (tandem/engine/models/registry.py)
                --check(): every field that changes the forward honoured or refused by name
                --arch():  ModelArch (shape + Features) --plan()--> the tensors to consume
                --model_class(): the nn.Module that computes it (imported on first use)

A field is in one of three sets: the family's ``fields`` (read into the arch; each may bound
its values), ``FOREIGN_FIELDS`` (forward-changing fields of other families, refused unless
they hold their neutral value), or ``INERT_FIELDS`` (metadata no forward reads). A key in none
of them is logged as unknown: config.json files carry tool metadata freely.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from tandem.engine.errors import UnsupportedConfigError
from tandem.engine.models.arch import Features, ModelArch
from tandem.engine.models.tensor_plan import WeightPlan, dense_plan

log = logging.getLogger(__name__)


def _any(_value: Any) -> bool:
    return True


def one_of(*values: Any) -> Callable[[Any], bool]:
    """An ``accepts`` predicate: the value is one of ``values``."""
    return lambda v: v in values


def neutral(v: Any) -> bool:
    """The value a foreign field holds when it changes nothing: absent, off, zero or empty."""
    return v is None or v is False or v == 0 or v == {} or v == [] or v == ()


@dataclass(frozen=True, slots=True)
class ConfigField:
    """One config field that changes the forward, and the values the forward computes."""

    name: str  # the key in config.json (``rope_parameters.rope_type``: a key inside one)
    accepts: Callable[[Any], bool] = _any
    why: str = ""  # what the refused values would need (the error says it)
    read: Callable[[Any], Any] | None = None  # the value from an HF config; default getattr
    default: Any = None  # the value a config without the key has

    def value(self, config: Any) -> Any:
        """This field's value in ``config`` (a transformers ``PretrainedConfig``)."""
        if self.read is not None:
            return self.read(config)
        return getattr(config, self.name, self.default)


def rope_parameters(config: Any) -> dict[str, Any]:
    """transformers 5 keeps ``rope_parameters``; 4.x had ``rope_scaling`` + ``rope_theta``."""
    params = getattr(config, "rope_parameters", None)
    if params:
        return dict(params)
    scaling = getattr(config, "rope_scaling", None) or {}
    return {"rope_type": scaling.get("rope_type", scaling.get("type", "default")), **scaling}


def _rope_type(config: Any) -> str:
    return str(rope_parameters(config).get("rope_type", "default"))


def _partial_rotary(config: Any) -> Any:
    return rope_parameters(config).get("partial_rotary_factor",
                                       getattr(config, "partial_rotary_factor", 1.0))


# Read by every dense family (llama.py, mistral.py, qwen2.py, qwen3.py).
COMMON_FIELDS: tuple[ConfigField, ...] = (
    ConfigField("vocab_size"), ConfigField("hidden_size"), ConfigField("intermediate_size"),
    ConfigField("num_hidden_layers"), ConfigField("num_attention_heads"),
    ConfigField("num_key_value_heads"), ConfigField("head_dim"),
    ConfigField("rms_norm_eps"), ConfigField("max_position_embeddings"),
    ConfigField("tie_word_embeddings", default=False), ConfigField("eos_token_id"),
    ConfigField("hidden_act", one_of("silu"), "the MLP computes SiLU-gated (SwiGLU) only",
                default="silu"),
    # the RoPE tables come from transformers' own rotary module (layers/rotary.py); dynamic
    # and longrope change the frequencies with the sequence length, which a paged cache of
    # rotated keys cannot follow
    ConfigField("rope_parameters.rope_type", one_of("default", "linear", "llama3", "yarn"),
                "RoPE types computed: default, linear, llama3, yarn", read=_rope_type),
    ConfigField("rope_parameters.partial_rotary_factor", one_of(1, 1.0, None),
                "RoPE rotates the whole head", read=_partial_rotary),
    ConfigField("rope_theta"), ConfigField("rope_scaling"),
)

# Fields other model families use to change the forward. A config of a family here that
# carries one with a non-neutral value is refused by name, never silently computed without it.
FOREIGN_FIELDS: tuple[ConfigField, ...] = tuple(
    ConfigField(name, neutral, why) for name, why in (
        ("attention_bias", "attention biases"),
        ("mlp_bias", "MLP biases"),
        ("attn_logit_softcapping", "attention logit soft-capping"),
        ("final_logit_softcapping", "final logit soft-capping"),
        ("query_pre_attn_scalar", "a query scale other than head_dim ** -0.5"),
        ("attention_multiplier", "a scaled attention"),
        ("embedding_multiplier", "scaled embeddings"),
        ("residual_multiplier", "a scaled residual"),
        ("logits_scaling", "scaled logits"),
        ("logit_scale", "scaled logits"),
        ("scale_emb", "scaled embeddings"),
        ("partial_rotary_factor", "partial RoPE"),
        ("rotary_pct", "partial RoPE"),
        ("use_qk_norm", "q/k norms"),
        ("qk_layernorm", "q/k norms"),
        ("use_parallel_residual", "parallel attention and MLP"),
        ("parallel_attn", "parallel attention and MLP"),
        ("attention_chunk_size", "chunked attention"),
        ("no_rope_layers", "layers without RoPE"),
        ("sliding_window", "sliding-window attention"),
        ("use_sliding_window", "sliding-window attention"),
        ("num_experts", "mixture of experts"),
        ("num_local_experts", "mixture of experts"),
        ("n_routed_experts", "mixture of experts"),
        ("moe_intermediate_size", "mixture of experts"),
        ("kv_lora_rank", "multi-head latent attention"),
        ("q_lora_rank", "multi-head latent attention"),
    )
) + (
    # all-full is what a family without sliding layers computes
    ConfigField("layer_types", lambda v: not v or set(v) == {"full_attention"},
                "full-attention layers only"),
    # a non-default value only slices the same matmuls (transformers 4.x)
    ConfigField("pretraining_tp", _any),
)

# Metadata that no forward reads (transformers' generic keys are added by the check).
INERT_FIELDS = frozenset({
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype",
    "_name_or_path", "bos_token_id", "pad_token_id", "sep_token_id", "initializer_range",
    "use_cache", "attention_dropout", "quantization_config",  # tandem/engine/quant/prequantized
    "auto_map", "tokenizer_class", "max_window_layers", "unsloth_version", "max_length",
    "output_attentions", "output_hidden_states", "return_dict", "id2label", "label2id",
})


@dataclass(frozen=True, slots=True)
class ExtraLayers:
    """Decoder layers a checkpoint carries past ``num_hidden_layers`` that no forward of ours
    reads (DeepSeek-V3's multi-token-prediction layers, ``model.layers.<n>.*``): the loader
    skips their tensors, saying so, instead of failing on them as left over."""

    layers: range  # their indices
    why: str  # what they are, for the log line

    def holds(self, name: str) -> bool:
        """Whether checkpoint tensor ``name`` belongs to one of these layers."""
        parts = name.split(".", 3)
        return (len(parts) == 4 and parts[:2] == ["model", "layers"]
                and parts[2].isdecimal() and len(parts[2]) < 10 and int(parts[2]) in self.layers)


def no_extra_layers(_config: Any) -> ExtraLayers | None:
    """A family whose checkpoints hold no layers past the forward's (every family but V3)."""
    return None


@dataclass(frozen=True, slots=True)
class FamilySpec:
    """A model family: what it reads from a config, what it refuses, what it consumes."""

    model_type: str  # config.json's model_type
    fields: tuple[ConfigField, ...]  # COMMON_FIELDS + the family's own
    features: Callable[[Any], Features]  # HF config -> what the forward computes
    gguf_architectures: tuple[str, ...] = ()  # GGUF general.architecture values it loads
    # "module:attribute" of the nn.Module computing it, imported on first use (the registry
    # stays torch-free: GGUF files are refused before anything heavy loads)
    forward: str = "tandem.engine.models.causal_lm:CausalLM"
    plan: Callable[[ModelArch], WeightPlan] = dense_plan
    # checkpoint tensors that carry nothing (buffers old exports saved), by name suffix
    ignored_tensors: tuple[str, ...] = ("rotary_emb.inv_freq",)
    # HF config -> layers past the forward's whose tensors are skipped (ExtraLayers)
    extra_layers: Callable[[Any], ExtraLayers | None] = no_extra_layers
    inert: frozenset[str] = field(default_factory=frozenset)  # the family's own metadata

    def check(self, config: Any, raw_keys: set[str] | None = None) -> None:
        """Raise UnsupportedConfigError for the first field whose value the forward does not
        compute; log the keys of ``raw_keys`` (config.json's) that no set names."""
        own = {f.name for f in self.fields}
        for f in self.fields + tuple(f for f in FOREIGN_FIELDS if f.name not in own):
            value = f.value(config)
            if not f.accepts(value):
                raise UnsupportedConfigError(self.model_type, f.name, value, f.why)
        if raw_keys:
            known = ({f.name.split(".")[0] for f in self.fields + FOREIGN_FIELDS}
                     | INERT_FIELDS | self.inert | _generic_keys())
            unknown = sorted(raw_keys - known)
            if unknown:
                log.warning("%s config: keys this engine does not know, ignored: %s",
                            self.model_type, ", ".join(unknown))

    def arch(self, config: Any) -> ModelArch:
        """Our summary of a checked config."""
        eos = config.eos_token_id
        eos_ids = tuple(eos) if isinstance(eos, list | tuple) else (() if eos is None else (eos,))
        heads = config.num_attention_heads
        features = self.features(config)
        if features.layer_types and len(features.layer_types) != config.num_hidden_layers:
            raise UnsupportedConfigError(
                self.model_type, "layer_types", len(features.layer_types),
                f"one entry per layer ({config.num_hidden_layers})")
        return ModelArch(
            model_type=self.model_type,
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            rms_norm_eps=config.rms_norm_eps,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            max_position_embeddings=config.max_position_embeddings,
            eos_token_ids=eos_ids,
            hidden_act=getattr(config, "hidden_act", "silu"),
            # shallow: a feature may itself be a dataclass (MoeArch, MlaDims)
            **{f.name: getattr(features, f.name) for f in fields(features)},
        )

    def model_class(self) -> type:
        """The nn.Module class computing this family (``forward``), imported now."""
        module, _, name = self.forward.partition(":")
        return getattr(importlib.import_module(module), name)


def _generic_keys() -> frozenset[str]:
    """The keys transformers writes into every config.json."""
    from transformers import PretrainedConfig

    return frozenset(PretrainedConfig().to_dict())
