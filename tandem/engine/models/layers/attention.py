"""Self-attention of one decoder layer over the paged KV cache."""

from __future__ import annotations

import torch
from torch import nn

from tandem.engine.attention.base import AttentionBackend, AttentionMetadata
from tandem.engine.models.arch import ModelArch
from tandem.engine.models.layers.norm import RMSNorm
from tandem.engine.models.layers.rotary import apply_rotary
from tandem.engine.models.linear import Linear


class Attention(nn.Module):
    """Fused QKV (optional bias), optional per-head q/k norm, RoPE, paged attention, the
    output projection (optional bias); through a sliding window of ``window`` positions when
    it is set (a query at p sees the keys at p - window + 1 .. p)."""

    def __init__(self, arch: ModelArch, window: int | None = None) -> None:
        super().__init__()
        self.window = window
        self.nh, self.nkv, self.hd = arch.num_heads, arch.num_kv_heads, arch.head_dim
        self.q_size, self.kv_size = self.nh * self.hd, self.nkv * self.hd
        self.scale = self.hd**-0.5
        self.qkv_proj = Linear(
            arch.hidden_size, self.q_size + 2 * self.kv_size, bias=arch.qkv_bias
        )
        self.o_proj = Linear(self.q_size, arch.hidden_size, bias=arch.o_bias)
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
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        backend.write_kv(k, v, kv_layer[0], kv_layer[1], meta.slot_mapping)
        o = backend.attend(q, kv_layer[0], kv_layer[1], meta, self.scale,
                           self.window)  # [T, nh, hd]
        return self.o_proj(o.reshape(t, self.q_size))
