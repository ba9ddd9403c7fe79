"""The DeepSeek-V2/V3 decoder: the dense decoder (causal_lm.py) with multi-head latent
attention in every layer (layers/mla.py) over the latent KV cache
``[L, 1, num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim]``.

Which feed-forward a layer has is decided in one place, ``mlp_for_layer``: DeepSeek's layers
from ``first_k_dense_replace`` on are mixture-of-experts (routed and shared experts). The
family specs (deepseek_v2.py, deepseek_v3.py) refuse every config with such a layer until the
MoE block is wired there, so every layer built today is the dense gated MLP.
"""

from __future__ import annotations

from torch import nn

from tandem.engine.models.arch import ModelArch
from tandem.engine.models.causal_lm import CausalLM, DecoderLayer
from tandem.engine.models.layers.mla import MlaAttention
from tandem.engine.models.layers.mlp import MLP


def mlp_for_layer(arch: ModelArch, index: int) -> nn.Module:
    """The feed-forward of decoder layer ``index``: the dense gated MLP (the specs admit
    only configs whose every layer is dense; the MoE block plugs in here)."""
    return MLP(arch)


class MlaCausalLM(CausalLM):
    """CausalLM whose layers attend with MLA; ``forward`` and ``compute_logits`` as its."""

    def make_layer(self, arch: ModelArch, index: int, window: int | None) -> nn.Module:
        return DecoderLayer(arch, window, attn=MlaAttention(arch), mlp=mlp_for_layer(arch, index))
