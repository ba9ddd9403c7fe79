"""The shape of a Llama-family model, read from its Hugging Face config.

Llama, Mistral, Qwen2, Qwen3 and SmolLM share one forward; they differ in a few switches
(q/k/v bias, per-head q/k RMSNorm, tied embeddings) and in their rotary parameters, which we
take from transformers' own rotary module so every RoPE variant it knows stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tandem.engine.errors import ModelLoadError

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")
_UNSUPPORTED_ROPE = ("dynamic", "longrope")
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(frozen=True, slots=True)
class ModelArch:
    """Everything our forward needs to know about a checkpoint's architecture."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    qkv_bias: bool
    qk_norm: bool
    sliding_window: int | None  # keys a sliding layer's query sees, itself included
    eos_token_ids: tuple[int, ...]
    # transformers' per-layer attention kinds ("full_attention" / "sliding_attention"); empty
    # when the config has none (then every layer slides when sliding_window is set: Mistral).
    # tandem/engine/models/windows.py turns them into each layer's window.
    layer_types: tuple[str, ...] = ()

    @classmethod
    def from_hf_config(cls, config: Any) -> ModelArch:
        """Read a transformers ``PretrainedConfig`` of a supported model type."""
        mt = config.model_type
        if mt not in SUPPORTED:
            raise ModelLoadError(f"model_type {mt!r} is not supported (supported: {SUPPORTED})")
        rope = _rope_parameters(config)
        if rope.get("rope_type", "default") in _UNSUPPORTED_ROPE:
            raise ModelLoadError(f"rope_type {rope['rope_type']!r} is not supported")
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        eos = config.eos_token_id
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        window = getattr(config, "sliding_window", None)
        if mt in ("qwen2", "qwen3") and not getattr(config, "use_sliding_window", False):
            window = None
        layer_types = tuple(getattr(config, "layer_types", None) or ())
        unknown = sorted(set(layer_types) - set(LAYER_TYPES))
        if unknown:
            raise ModelLoadError(f"layer_types {unknown} are not supported (supported: "
                                 f"{LAYER_TYPES})")
        if layer_types and len(layer_types) != config.num_hidden_layers:
            raise ModelLoadError(f"layer_types names {len(layer_types)} layers, the model has "
                                 f"{config.num_hidden_layers}")
        return cls(
            model_type=mt,
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=config.num_attention_heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            head_dim=head_dim,
            rms_norm_eps=config.rms_norm_eps,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            max_position_embeddings=config.max_position_embeddings,
            qkv_bias=mt == "qwen2" or bool(getattr(config, "attention_bias", False)),
            qk_norm=mt == "qwen3",
            sliding_window=window,
            eos_token_ids=eos_ids,
            layer_types=layer_types,
        )


def _rope_parameters(config: Any) -> dict[str, Any]:
    """transformers 5 keeps ``rope_parameters``; 4.x had ``rope_scaling`` + ``rope_theta``."""
    params = getattr(config, "rope_parameters", None)
    if params:
        return dict(params)
    scaling = getattr(config, "rope_scaling", None) or {}
    return {"rope_type": scaling.get("rope_type", scaling.get("type", "default")), **scaling}


def rotary_tables(config: Any, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos/sin tables ``[max_positions, head_dim]``, exactly as transformers builds them.

    We borrow transformers' rotary module for ``inv_freq`` and ``attention_scaling`` (it knows
    default, linear, llama3 and yarn scaling), then tabulate ``cos(pos * inv_freq)`` once.
    """
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rotary = LlamaRotaryEmbedding(config=config)
    inv_freq = rotary.inv_freq.float()  # [head_dim / 2]
    pos = torch.arange(max_positions, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]  # [P, head_dim / 2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [P, head_dim]
    scale = float(rotary.attention_scaling)
    return emb.cos() * scale, emb.sin() * scale
