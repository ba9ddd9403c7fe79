"""A model's shape, as much of it as a roofline needs: how many bytes and FLOPs a token costs.

Decoder-only transformers with grouped-query attention and gated (SwiGLU) MLPs, dense or
Mixtral-style mixture-of-experts. Parameter counts follow from the config::

    embedding   vocab x hidden (once more for the LM head unless tied)
    per layer   attention  hidden x (heads + 2 kv_heads) x head_dim    q, k, v
                           + heads x head_dim x hidden                 o  (+ q/k/v biases)
                MLP        experts x 3 x hidden x intermediate         gate, up, down
                           (+ hidden x experts router when experts > 1)
                norms      2 x hidden (+ hidden for the final norm)

    total params    every weight: what the GPU stores and a full step reads
    active params   the weights one token multiplies by (top-k of the experts)

    KV bytes per token = 2 (K and V) x layers x kv_heads x head_dim x kv_dtype_bytes

Quantized checkpoints (FP8, INT4) quantize the transformer body; the embedding and LM head
stay BF16, as AWQ, GPTQ and vLLM's FP8 do by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Bytes per stored weight. FP8 adds one scale per output channel (negligible); INT4 (AWQ,
# GPTQ) adds a BF16 scale per group of 128 weights: 2 / 128 bytes.
WEIGHT_BYTES: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int4": 0.5 + 2 / 128}
KV_BYTES: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}


class ModelError(ValueError):
    """A model shape that is inconsistent, or a config that does not describe one."""


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A decoder-only transformer's dimensions (names as in a Hugging Face config)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # per expert for a mixture of experts
    vocab: int
    tie_embeddings: bool = False
    attention_bias: bool = False  # q/k/v biases (Qwen2)
    experts: int = 1
    experts_per_token: int = 1

    def __post_init__(self) -> None:
        if min(self.layers, self.hidden, self.heads, self.kv_heads, self.head_dim,
               self.intermediate, self.vocab, self.experts, self.experts_per_token) < 1:
            raise ModelError(f"model {self.name!r}: every dimension must be >= 1")
        if self.heads % self.kv_heads or self.experts_per_token > self.experts:
            raise ModelError(f"model {self.name!r}: kv_heads must divide heads and "
                             "experts_per_token <= experts")

    @property
    def embedding_params(self) -> int:
        """Input embedding plus (untied) LM head."""
        return self.vocab * self.hidden * (1 if self.tie_embeddings else 2)

    def _attention_params(self) -> int:
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        bias = (self.heads + 2 * self.kv_heads) * self.head_dim if self.attention_bias else 0
        return qkv + bias + self.heads * self.head_dim * self.hidden + 2 * self.hidden

    def _mlp_params(self, experts: int) -> int:
        router = self.hidden * self.experts if self.experts > 1 else 0
        return experts * 3 * self.hidden * self.intermediate + router

    @property
    def params(self) -> int:
        """Every weight the model stores."""
        per_layer = self._attention_params() + self._mlp_params(self.experts)
        return self.layers * per_layer + self.embedding_params + self.hidden

    @property
    def active_params(self) -> int:
        """The weights one token multiplies by: ``params`` less the unrouted experts."""
        per_layer = self._attention_params() + self._mlp_params(self.experts_per_token)
        return self.layers * per_layer + self.embedding_params + self.hidden

    @property
    def lm_head_params(self) -> int:
        """The output projection (the embedding itself when tied)."""
        return self.vocab * self.hidden

    def weight_bytes(self, weight_dtype: str = "bf16") -> float:
        """Bytes the weights take: the body at ``weight_dtype``, embedding and head in BF16."""
        per_weight = _lookup(WEIGHT_BYTES, weight_dtype, "weight dtype")
        body = self.params - self.embedding_params
        return body * per_weight + self.embedding_params * WEIGHT_BYTES["bf16"]

    def kv_bytes_per_token(self, kv_dtype: str = "bf16", kv_heads: int | None = None) -> int:
        """KV cache bytes one token takes (``kv_heads``: the heads one GPU holds, if sharded)."""
        per_value = _lookup(KV_BYTES, kv_dtype, "KV dtype")
        heads = self.kv_heads if kv_heads is None else kv_heads
        return round(2 * self.layers * heads * self.head_dim * per_value)


def _lookup(table: dict[str, float], key: str, what: str) -> float:
    try:
        return table[key]
    except KeyError:
        raise ModelError(f"unknown {what} {key!r}; known: {', '.join(table)}") from None


def from_hf_config(config: dict[str, Any], name: str = "") -> ModelShape:
    """The shape a Hugging Face ``config.json`` (as a dict) describes.

    Reads Llama/Qwen2/Mistral/Mixtral-style keys; a multimodal config's ``text_config`` is
    used when present. ModelError names a missing key.
    """
    cfg = config.get("text_config", config)
    try:
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        return ModelShape(
            name=name or str(cfg.get("_name_or_path", "") or cfg.get("model_type", "model")),
            layers=int(cfg["num_hidden_layers"]),
            hidden=hidden,
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate=int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"]),
            vocab=int(cfg["vocab_size"]),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases; Llama-style configs say so in attention_bias.
            attention_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
            experts=int(cfg.get("num_local_experts") or cfg.get("num_experts") or 1),
            experts_per_token=int(cfg.get("num_experts_per_tok") or 1),
        )
    except KeyError as exc:
        raise ModelError(f"config has no {exc.args[0]!r}") from None


# Published configs (config.json on the Hugging Face Hub). Derived parameter counts:
# 8.03B, 70.6B, 7.62B, 72.7B, 46.7B total / 12.9B active, 134.5M.
MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape("Llama-3.1-8B", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                   intermediate=14336, vocab=128256),
        ModelShape("Llama-3.1-70B", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128,
                   intermediate=28672, vocab=128256),
        ModelShape("Qwen2.5-7B", layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128,
                   intermediate=18944, vocab=152064, attention_bias=True),
        ModelShape("Qwen2.5-72B", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128,
                   intermediate=29568, vocab=152064, attention_bias=True),
        ModelShape("Mixtral-8x7B", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                   intermediate=14336, vocab=32000, experts=8, experts_per_token=2),
        ModelShape("SmolLM2-135M", layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64,
                   intermediate=1536, vocab=49152, tie_embeddings=True),
    )
}


def get_model(name: str) -> ModelShape:
    """The table's model called ``name`` (case-insensitive); KeyError lists the names."""
    for key, model in MODELS.items():
        if key.lower() == name.lower():
            return model
    raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
