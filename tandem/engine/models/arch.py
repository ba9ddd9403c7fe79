"""The shape of a decoder-only model and the features its forward computes.

A family's spec (tandem/engine/models/spec.py) reads a checkpoint's Hugging Face config into one
of these; everything downstream (the torch forward, the native fused forward, the KV cache,
the KV handoff's layout) reads this, never the HF config. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.common.kv_cache_shape import KvCacheShape, kv_cache_shape


@dataclass(frozen=True, slots=True)
class MoeArch:
    """A mixture-of-experts feed-forward: which layers have one, how tokens are routed to
    experts and what else the block computes (tandem/engine/models/layers/moe.py).

    ``routing`` picks the router (tandem/engine/models/layers/moe_routing.py):

        softmax      softmax over all experts, top-k, renormalised when ``norm_topk_prob``
                     (Mixtral: always; Qwen2-MoE / Qwen3-MoE: per config)
        deepseek_v2  softmax, top-k by ``topk_method`` ("greedy", "group_limited_greedy":
                     the best ``topk_group`` of ``n_group`` groups by their best expert),
                     weights x ``routed_scaling_factor``
        deepseek_v3  sigmoid scores; experts chosen on scores + ``e_score_correction_bias``
                     within the best ``topk_group`` groups (a group ranked by its two best);
                     weights the chosen raw scores, renormalised when ``norm_topk_prob``, x
                     ``routed_scaling_factor``
    """

    num_experts: int
    top_k: int  # experts per token
    expert_intermediate_size: int  # each routed expert's gated MLP width
    sparse_layers: tuple[int, ...]  # the layers whose MLP is this block (others: dense MLP)
    routing: str = "softmax"
    norm_topk_prob: bool = True
    topk_method: str = "greedy"  # deepseek_v2 only
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    shared_intermediate_size: int = 0  # the always-on shared expert's width; 0: none
    shared_expert_gate: bool = False  # sigmoid(x . w) scales the shared expert (Qwen2-MoE)


@dataclass(frozen=True, slots=True)
class MlaDims:
    """Multi-head latent attention (DeepSeek-V2/V3): keys and values of every head are
    decompressed from one latent vector per token, which is all the KV cache holds.

        h --kv_a_proj_with_mqa--> [c (kv_lora_rank) | k_pe (qk_rope_head_dim)]
        c --kv_a_layernorm--> cached;  k_pe --RoPE--> cached (one head shared by all)
        cached c --kv_b_proj--> per head [k_nope (qk_nope_head_dim) | v (v_head_dim)]
        h --q_proj, or q_a_proj -> q_a_layernorm -> q_b_proj (q-LoRA)--> [q_nope | q_pe]
    """

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None  # None: q projected from the hidden state directly (q_proj)
    softmax_scale: float  # qk_head_dim ** -0.5, times yarn's mscale(mscale_all_dim) squared
    rope_interleave: bool  # RoPE rotates adjacent pairs (x0, x1), (x2, x3), ... (DeepSeek)
    latent_bias: bool  # q_a_proj and kv_a_proj_with_mqa carry a bias (attention_bias)

    @property
    def latent_dim(self) -> int:
        """Values cached per token and layer: the latent and its rotated key part."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        """A decompressed key's (and a query's) width per head."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


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
    moe: MoeArch | None = None  # None: every layer's MLP is dense
    mla: MlaDims | None = None  # multi-head latent attention (DeepSeek-V2/V3)


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
    moe: MoeArch | None = None  # as Features.moe
    # Multi-head latent attention: the cache holds one latent "head" per token and layer
    # (the properties below); num_kv_heads / head_dim stay what the HF config says.
    mla: MlaDims | None = None

    # -- the paged KV cache: kv[layer, plane, block, offset, head, :] ---------------------
    @property
    def kv_shape(self) -> KvCacheShape:
        """One token's cache in one layer (tandem/common/kv_cache_shape.py: the planner
        sizes the cache from the same function)."""
        if self.mla is None:
            return kv_cache_shape(self.num_kv_heads, self.head_dim)
        return kv_cache_shape(self.num_kv_heads, self.head_dim, self.mla.kv_lora_rank,
                              self.mla.qk_rope_head_dim)

    @property
    def kv_planes(self) -> int:
        """Planes per layer: K and V (2), or the one latent plane of MLA (1)."""
        return self.kv_shape.planes

    @property
    def kv_cache_heads(self) -> int:
        """Heads per plane: the KV heads, or MLA's one shared latent head."""
        return self.kv_shape.heads

    @property
    def kv_cache_dim(self) -> int:
        """Values per head vector: head_dim, or MLA's kv_lora_rank + qk_rope_head_dim."""
        return self.kv_shape.dim

    @property
    def attention_width(self) -> int:
        """Values per token of a step's q, k and v activations (MLA: decompressed)."""
        if self.mla is None:
            return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        m = self.mla
        return self.num_heads * (2 * m.qk_head_dim + m.v_head_dim) + m.latent_dim
