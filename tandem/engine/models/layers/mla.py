"""Multi-head latent attention of one decoder layer (DeepSeek-V2/V3) over the paged latent
cache (tandem/engine/attention/mla.py).

    h --q_proj | q_a_proj -> q_a_layernorm -> q_b_proj--> q [H, nope | rope]
    h --kv_a_proj_with_mqa--> [c (R) | k_pe (rope)];  c --kv_a_layernorm-->
    RoPE on q_pe and k_pe;  [c | k_pe] --> the cache (one row per token)
    prefill rows: attend over the decompressed context (kv_b_proj: k_nope, v per head)
    decode rows:  attend in latent space with W_UK folded into q, out through W_UV
    --> o_proj

The weights are transformers' (names and shapes), so a checkpoint loads as it is; numerics
follow transformers' DeepseekV2/V3Attention (fp32 RMSNorms, the softmax scale with yarn's
mscale: tandem/engine/models/deepseek_v2.py).
"""

from __future__ import annotations

import torch
from torch import nn

from tandem.engine.attention.base import AttentionBackend, AttentionMetadata
from tandem.engine.attention.mla import (
    attend_absorbed,
    attend_decompressed,
    decode_rows,
    write_latent,
)
from tandem.engine.models.arch import ModelArch
from tandem.engine.models.layers.norm import RMSNorm
from tandem.engine.models.layers.rotary import apply_rotary, apply_rotary_interleaved
from tandem.engine.models.linear import Linear

# transformers (and DeepSeek's own code) build q_a_layernorm and kv_a_layernorm with
# RMSNorm's default eps, not the config's rms_norm_eps
LATENT_NORM_EPS = 1e-6


class MlaAttention(nn.Module):
    """MLA with optional q-LoRA; ``absorb`` (default on): decode rows attend in latent space
    (off: every row through the decompressed path; the two are equal in exact arithmetic)."""

    absorb: bool = True

    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        m = arch.mla
        assert m is not None, "MlaAttention needs an MLA arch"
        self.nh, self.rank, self.scale = arch.num_heads, m.kv_lora_rank, m.softmax_scale
        self.nope, self.rope, self.vd = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
        self.qk = m.qk_head_dim
        self.rotate = apply_rotary_interleaved if m.rope_interleave else apply_rotary
        q_out = self.nh * self.qk
        if m.q_lora_rank:
            self.q_a_proj = Linear(arch.hidden_size, m.q_lora_rank, bias=m.latent_bias)
            self.q_a_layernorm = RMSNorm(m.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = Linear(m.q_lora_rank, q_out, bias=False)
        else:
            self.q_proj = Linear(arch.hidden_size, q_out, bias=False)
        self.kv_a_proj_with_mqa = Linear(arch.hidden_size, m.latent_dim, bias=m.latent_bias)
        self.kv_a_layernorm = RMSNorm(m.kv_lora_rank, LATENT_NORM_EPS)
        # a plain nn.Linear, which --quantization leaves as it is: absorption reads its weight
        self.kv_b_proj = nn.Linear(m.kv_lora_rank, self.nh * (self.nope + self.vd), bias=False)
        self.o_proj = Linear(self.nh * self.vd, arch.hidden_size, bias=arch.o_bias)
        self.q_lora = bool(m.q_lora_rank)

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]
        cos: torch.Tensor,  # [T, 1, rope]
        sin: torch.Tensor,
        kv_layer: torch.Tensor,  # [1, num_blocks, bs, 1, R + rope]
        meta: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        t = x.shape[0]
        q = (self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.q_lora
             else self.q_proj(x)).view(t, self.nh, self.qk)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        c, k_pe = self.kv_a_proj_with_mqa(x).split([self.rank, self.rope], dim=-1)
        q_pe = self.rotate(q_pe, cos, sin)
        k_pe = self.rotate(k_pe[:, None, :], cos, sin)[:, 0]
        cache = kv_layer[0]
        write_latent(backend, torch.cat((self.kv_a_layernorm(c), k_pe), dim=-1), cache,
                     meta.slot_mapping)
        out = x.new_empty(t, self.nh, self.vd)
        nd = meta.num_decodes if self.absorb else 0
        if nd:
            w_uk, w_uv = self._absorbed_weights()
            q_lat = torch.einsum("thn,hnr->thr", q_nope[:nd], w_uk)
            o_lat = attend_absorbed(backend, torch.cat((q_lat, q_pe[:nd]), dim=-1), cache,
                                    decode_rows(meta), self.scale, self.rank)  # [nd, H, R]
            out[:nd] = torch.einsum("thr,hvr->thv", o_lat, w_uv)
        if nd < t:
            query = torch.cat((q_nope[nd:], q_pe[nd:]), dim=-1)
            out[nd:] = attend_decompressed(query, cache, meta, nd if self.absorb else 0,
                                           self.scale, self._decompress, self.vd)
        return self.o_proj(out.reshape(t, self.nh * self.vd))

    def _absorbed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """kv_b_proj's rows per head: W_UK ``[H, nope, R]`` and W_UV ``[H, vd, R]`` (views)."""
        w = self.kv_b_proj.weight.view(self.nh, self.nope + self.vd, self.rank)
        return w[:, : self.nope], w[:, self.nope :]

    def _decompress(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cached rows ``[S, R + rope]`` -> keys ``[S, H, nope + rope]``, values ``[S, H, vd]``."""
        s = rows.shape[0]
        kv = self.kv_b_proj(rows[:, : self.rank]).view(s, self.nh, self.nope + self.vd)
        k_nope, v = kv.split([self.nope, self.vd], dim=-1)
        k_pe = rows[:, None, self.rank :].expand(s, self.nh, self.rope)
        return torch.cat((k_nope, k_pe), dim=-1), v
