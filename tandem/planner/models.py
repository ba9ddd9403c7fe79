"""A model's shape, as much of it as a roofline needs: how many bytes and FLOPs a token costs.

Decoder-only transformers with grouped-query attention or DeepSeek's multi-head latent
attention (MLA), and gated (SwiGLU) MLPs, dense or mixture-of-experts (Mixtral, Qwen-MoE,
DeepSeek: shared experts, leading dense layers). Parameter counts follow from the config::

    embedding   vocab x hidden (once more for the LM head unless tied)
    per layer   attention  GQA  hidden x (heads + 2 kv_heads) x head_dim       q, k, v
                                + heads x head_dim x hidden                     o (+ q/k/v biases)
                           MLA  hidden x heads x qk  (q-LoRA: hidden x q_lora    q
                                  + q_lora + q_lora x heads x qk)
                                + hidden x (kv_lora + rope) + kv_lora           latent, its norm
                                + kv_lora x heads x (nope + v)                  decompression
                                + heads x v x hidden                            o
                                (qk = nope + rope: a query head's width)
                MLP        dense    3 x hidden x intermediate                  gate, up, down
                           MoE      experts x 3 x hidden x intermediate
                                    + 3 x hidden x shared_intermediate         shared experts
                                    + hidden x experts                         router
                           (dense_layers of a MoE model: 3 x hidden x dense_intermediate)
                norms      2 x hidden (+ hidden for the final norm)

    total params    every weight: what the GPU stores and a full step reads
    active params   the weights one token multiplies by (top-k of the experts)

    KV bytes per token = layers x the cache's values per token and layer x kv_dtype_bytes
        GQA  2 (K and V) x kv_heads x head_dim
        MLA  kv_lora_rank + qk_rope_head_dim: one latent row, whatever the heads
    (tandem/common/kv_cache_shape.py, which the engine's cache is sized by too)

Quantized checkpoints (FP8, INT4) quantize the transformer body; the embedding and LM head
stay BF16, as AWQ, GPTQ and vLLM's FP8 do by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tandem.common.kv_cache_shape import KvCacheShape, kv_cache_shape

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
    # Multi-head latent attention (DeepSeek-V2/V3); kv_lora_rank 0: grouped-query attention
    kv_lora_rank: int = 0
    q_lora_rank: int = 0  # 0: the query is projected from the hidden state directly
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # Mixture of experts: the always-on shared experts' total width (Qwen2-MoE, DeepSeek), and
    # the layers whose MLP is dense instead (DeepSeek's first_k_dense_replace), that wide
    shared_intermediate: int = 0
    dense_layers: int = 0
    dense_intermediate: int = 0

    def __post_init__(self) -> None:
        if min(self.layers, self.hidden, self.heads, self.kv_heads, self.head_dim,
               self.intermediate, self.vocab, self.experts, self.experts_per_token) < 1:
            raise ModelError(f"model {self.name!r}: every dimension must be >= 1")
        if self.heads % self.kv_heads or self.experts_per_token > self.experts:
            raise ModelError(f"model {self.name!r}: kv_heads must divide heads and "
                             "experts_per_token <= experts")
        if self.mla and min(self.qk_rope_head_dim, self.qk_nope_head_dim, self.v_head_dim) < 1:
            raise ModelError(f"model {self.name!r}: latent attention needs qk_rope_head_dim, "
                             "qk_nope_head_dim and v_head_dim >= 1")
        if not 0 <= self.dense_layers <= self.layers or (self.dense_layers
                                                         and self.dense_intermediate < 1):
            raise ModelError(f"model {self.name!r}: dense_layers must be in [0, layers], "
                             "with a dense_intermediate")

    @property
    def mla(self) -> bool:
        """Whether attention is multi-head latent attention (a latent KV cache)."""
        return self.kv_lora_rank > 0

    @property
    def kv_cache(self) -> KvCacheShape:
        """One token's cache in one layer, as the engine allocates it."""
        return kv_cache_shape(self.kv_heads, self.head_dim, self.kv_lora_rank,
                              self.qk_rope_head_dim)

    @property
    def embedding_params(self) -> int:
        """Input embedding plus (untied) LM head."""
        return self.vocab * self.hidden * (1 if self.tie_embeddings else 2)

    def _attention_params(self) -> int:
        norms = 2 * self.hidden
        if self.mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (self.hidden * self.q_lora_rank + self.q_lora_rank
                 + self.q_lora_rank * self.heads * qk) if self.q_lora_rank else (
                self.hidden * self.heads * qk)
            latent = self.kv_lora_rank + self.qk_rope_head_dim
            kv = self.hidden * latent + self.kv_lora_rank + self.kv_lora_rank * self.heads * (
                self.qk_nope_head_dim + self.v_head_dim)
            bias = self.q_lora_rank + latent if self.attention_bias else 0
            return q + kv + bias + self.heads * self.v_head_dim * self.hidden + norms
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        bias = (self.heads + 2 * self.kv_heads) * self.head_dim if self.attention_bias else 0
        return qkv + bias + self.heads * self.head_dim * self.hidden + norms

    def _mlp_params(self, experts: int) -> int:
        """A sparse layer's MLP with ``experts`` routed experts counted (a dense model's MLP
        when the model has one expert)."""
        router = self.hidden * self.experts if self.experts > 1 else 0
        shared = 3 * self.hidden * self.shared_intermediate
        return experts * 3 * self.hidden * self.intermediate + shared + router

    def _params(self, experts: int) -> int:
        dense = self.dense_layers * (self._attention_params()
                                     + 3 * self.hidden * self.dense_intermediate)
        sparse = (self.layers - self.dense_layers) * (self._attention_params()
                                                     + self._mlp_params(experts))
        return dense + sparse + self.embedding_params + self.hidden

    @property
    def params(self) -> int:
        """Every weight the model stores."""
        return self._params(self.experts)

    @property
    def active_params(self) -> int:
        """The weights one token multiplies by: ``params`` less the unrouted experts."""
        return self._params(self.experts_per_token)

    @property
    def lm_head_params(self) -> int:
        """The output projection (the embedding itself when tied)."""
        return self.vocab * self.hidden

    @property
    def attention_pair_flops(self) -> int:
        """FLOPs of prefill attention per (query, key) pair, all layers and heads: QK^T and
        PV, 2 each per head dimension (MLA: its keys' and values' decompressed widths)."""
        if self.mla:
            per_head = self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim
        else:
            per_head = 2 * self.head_dim
        return 2 * self.layers * self.heads * per_head

    def weight_bytes(self, weight_dtype: str = "bf16") -> float:
        """Bytes the weights take: the body at ``weight_dtype``, embedding and head in BF16."""
        per_weight = _lookup(WEIGHT_BYTES, weight_dtype, "weight dtype")
        body = self.params - self.embedding_params
        return body * per_weight + self.embedding_params * WEIGHT_BYTES["bf16"]

    def kv_bytes_per_token(self, kv_dtype: str = "bf16", gpus: int = 1) -> int:
        """KV cache bytes one token takes on one of ``gpus`` tensor-parallel GPUs (its share
        of the KV heads; MLA's latent whole on each); ``gpus`` = 1: what a handoff carries."""
        per_value = _lookup(KV_BYTES, kv_dtype, "KV dtype")
        return round(self.layers * self.kv_cache.values_per_gpu(gpus) * per_value)


def _lookup(table: dict[str, float], key: str, what: str) -> float:
    try:
        return table[key]
    except KeyError:
        raise ModelError(f"unknown {what} {key!r}; known: {', '.join(table)}") from None


def from_hf_config(config: dict[str, Any], name: str = "") -> ModelShape:
    """The shape a Hugging Face ``config.json`` (as a dict) describes.

    Reads Llama/Qwen2/Mistral-style keys, the mixture-of-experts ones of Mixtral, Qwen2-MoE /
    Qwen3-MoE and DeepSeek, and DeepSeek's latent attention (``kv_lora_rank``); a multimodal
    config's ``text_config`` is used when present. ModelError names a missing key.
    """
    cfg = config.get("text_config", config)
    try:
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        experts = int(cfg.get("num_local_experts") or cfg.get("num_experts")
                      or cfg.get("n_routed_experts") or 1)
        moe_width = int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"])
        dense = _dense_layers(cfg, layers) if experts > 1 else 0
        mla: dict[str, int] = {}
        if cfg.get("kv_lora_rank"):
            mla = dict(kv_lora_rank=int(cfg["kv_lora_rank"]),
                       q_lora_rank=int(cfg.get("q_lora_rank") or 0),
                       qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
                       qk_nope_head_dim=int(cfg["qk_nope_head_dim"]),
                       v_head_dim=int(cfg["v_head_dim"]))
        return ModelShape(
            name=name or str(cfg.get("_name_or_path", "") or cfg.get("model_type", "model")),
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            # MLA: a query head's width (its cache is the latent row, not heads)
            head_dim=(mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"] if mla
                      else int(cfg.get("head_dim") or hidden // heads)),
            intermediate=moe_width,
            vocab=int(cfg["vocab_size"]),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases; Llama-style configs say so in attention_bias.
            attention_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
            experts=experts,
            experts_per_token=int(cfg.get("num_experts_per_tok") or 1),
            shared_intermediate=_shared_width(cfg, moe_width) if experts > 1 else 0,
            dense_layers=dense,
            dense_intermediate=int(cfg["intermediate_size"]) if dense else 0,
            **mla,
        )
    except KeyError as exc:
        raise ModelError(f"config has no {exc.args[0]!r}") from None


def _shared_width(cfg: dict[str, Any], moe_width: int) -> int:
    """The shared experts' total width: Qwen2-MoE's one shared expert, DeepSeek's
    ``n_shared_experts`` of the routed experts' width."""
    if cfg.get("shared_expert_intermediate_size"):
        return int(cfg["shared_expert_intermediate_size"])
    return int(cfg.get("n_shared_experts") or 0) * moe_width


def _dense_layers(cfg: dict[str, Any], layers: int) -> int:
    """How many layers of a MoE model have a dense MLP: DeepSeek's first
    ``first_k_dense_replace``; Qwen-MoE's ``mlp_only_layers`` and those
    ``decoder_sparse_step`` skips."""
    if "first_k_dense_replace" in cfg:
        return min(int(cfg["first_k_dense_replace"] or 0), layers)
    only = {int(i) for i in cfg.get("mlp_only_layers") or ()}
    step = int(cfg.get("decoder_sparse_step") or 1)
    return sum(1 for i in range(layers) if i in only or (i + 1) % step)


# Published configs (config.json on the Hugging Face Hub). Derived parameter counts:
# 8.03B, 70.6B, 7.62B, 72.7B, 46.7B total / 12.9B active, 134.5M, 671B total / 37.5B active
# (DeepSeek-V3 without its multi-token-prediction layer, which plain decoding never runs).
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
        ModelShape("DeepSeek-V3", layers=61, hidden=7168, heads=128, kv_heads=128,
                   head_dim=192, intermediate=2048, vocab=129280, experts=256,
                   experts_per_token=8, kv_lora_rank=512, q_lora_rank=1536,
                   qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                   shared_intermediate=2048, dense_layers=3, dense_intermediate=18432),
    )
}


def get_model(name: str) -> ModelShape:
    """The table's model called ``name`` (case-insensitive); KeyError lists the names."""
    for key, model in MODELS.items():
        if key.lower() == name.lower():
            return model
    raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
