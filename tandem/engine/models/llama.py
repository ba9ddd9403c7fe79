"""Our Llama-family forward over the paged KV cache (Llama, Mistral, Qwen2, Qwen3, SmolLM).

Tokens arrive flattened (``[T]``, see tandem/engine/attention/base.py); every layer writes its new
K/V into the cache through the attention backend and attends over the paged context. Q/K/V and
gate/up are fused into one matmul each. Numerics follow transformers (RMSNorm in fp32, RoPE
tables in fp32 cast to the activation dtype) so greedy decoding matches ``generate()``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from tandem.engine.attention.base import AttentionBackend, AttentionMetadata
from tandem.engine.models.arch import ModelArch
from tandem.engine.models.linear import Linear
from tandem.engine.models.windows import layer_windows


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32, scaled in the input dtype (as transformers does)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    """Self-attention of one layer: fused QKV, optional q/k norm, RoPE, paged attention
    (through a sliding window of ``window`` positions when it is set)."""

    def __init__(self, arch: ModelArch, window: int | None = None) -> None:
        super().__init__()
        self.window = window
        self.nh, self.nkv, self.hd = arch.num_heads, arch.num_kv_heads, arch.head_dim
        self.q_size, self.kv_size = self.nh * self.hd, self.nkv * self.hd
        self.scale = self.hd**-0.5
        self.qkv_proj = Linear(
            arch.hidden_size, self.q_size + 2 * self.kv_size, bias=arch.qkv_bias
        )
        self.o_proj = Linear(self.q_size, arch.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.hd, arch.rms_norm_eps) if arch.qk_norm else None
        self.k_norm = RMSNorm(self.hd, arch.rms_norm_eps) if arch.qk_norm else None

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]
        cos: torch.Tensor,  # [T, 1, hd]
        sin: torch.Tensor,  # [T, 1, hd]
        kv_layer: torch.Tensor,  # [2, num_blocks, bs, Hkv, hd]
        meta: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.nh, self.hd)
        k = k.view(t, self.nkv, self.hd)
        v = v.view(t, self.nkv, self.hd)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        backend.write_kv(k, v, kv_layer[0], kv_layer[1], meta.slot_mapping)
        o = backend.attend(q, kv_layer[0], kv_layer[1], meta, self.scale,
                           self.window)  # [T, nh, hd]
        return self.o_proj(o.reshape(t, self.q_size))


class MLP(nn.Module):
    """SwiGLU feed-forward with gate and up fused."""

    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.inter = arch.intermediate_size
        self.gate_up_proj = Linear(arch.hidden_size, 2 * self.inter, bias=False)
        self.down_proj = Linear(self.inter, arch.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.inter, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, arch: ModelArch, window: int | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.self_attn = Attention(arch, window)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.mlp = MLP(arch)

    def forward(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_layer: torch.Tensor,
        meta: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, kv_layer, meta, backend)
        return h + self.mlp(self.post_attention_layernorm(h))


LayerHook = Callable[[int], None]


class LlamaForCausalLM(nn.Module):
    """The whole model; ``forward`` returns hidden states, ``compute_logits`` the vocab scores."""

    # How the checkpoint's weights were stored: "none" (float), or the pre-quantized format
    # the loader read, e.g. "awq-int4-g128" (tandem/engine/quant/prequantized; set by load_model).
    quant_format: str = "none"

    def __init__(self, arch: ModelArch, cos: torch.Tensor, sin: torch.Tensor) -> None:
        super().__init__()
        self.arch = arch
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(arch, w) for w in layer_windows(arch))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.lm_head = Linear(arch.hidden_size, arch.vocab_size, bias=False)
        if arch.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("cos_table", cos, persistent=False)  # [P, hd] fp32
        self.register_buffer("sin_table", sin, persistent=False)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_cache: torch.Tensor,  # [L, 2, num_blocks, bs, Hkv, hd]
        meta: AttentionMetadata,
        backend: AttentionBackend,
        layer_hook: LayerHook | None = None,
    ) -> torch.Tensor:  # [T, hidden]
        h = self.embed_tokens(input_ids)
        cos = self.cos_table[positions].to(h.dtype)[:, None, :]  # [T, 1, hd]
        sin = self.sin_table[positions].to(h.dtype)[:, None, :]
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, kv_cache[i], meta, backend)
            if layer_hook is not None:
                layer_hook(i)  # layer i's KV for this step is now in the cache
        return self.norm(h)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [n, hidden] -> [n, V]
        """Vocabulary logits in fp32 for the rows that sample."""
        return self.lm_head(hidden).float()
