"""The shape of a decoder-only model and the features its forward computes.

A family's spec (tandem/engine/models/spec.py) reads a checkpoint's Hugging Face config into one
of these; everything downstream (the torch forward, the native fused forward, the KV cache,
the KV handoff's layout) reads this, never the HF config. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Features:
    """What differs between the dense families' forwards (all default off)."""

    qkv_bias: bool = False  # q/k/v projections carry a bias
    o_bias: bool = False  # the attention output projection carries a bias
    mlp_bias: bool = False  # gate/up/down carry biases
    qk_norm: bool = False  # per-head RMSNorm on q and k before RoPE (Qwen3)
    # None, or the window in tokens of the layers that attend through one (a token attends to
    # itself and the window - 1 before it)
    sliding_window: int | None = None
    # transformers' per-layer attention kinds ("full_attention" / "sliding_attention"); empty
    # when the config has none (then every layer slides when sliding_window is set: Mistral).
    # tandem/engine/models/windows.py turns them into each layer's window.
    layer_types: tuple[str, ...] = ()


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
    eos_token_ids: tuple[int, ...]
    hidden_act: str = "silu"  # the gate's activation (SwiGLU)
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()  # as Features.layer_types
