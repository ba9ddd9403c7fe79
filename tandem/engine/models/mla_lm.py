"""The DeepSeek-V2/V3 decoder: the decoder of causal_lm.py with multi-head latent attention in
every layer (layers/mla.py) over the latent KV cache
``[L, 1, num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim]``.

Which feed-forward a layer has is decided in one place, ``mlp_for_layer``: DeepSeek's layers
from ``first_k_dense_replace`` on are mixture-of-experts (routed and shared experts,
layers/moe.py), the ones before it the dense gated MLP.
"""

from __future__ import annotations

from torch import nn

from tandem.engine.models.arch import ModelArch
from tandem.engine.models.causal_lm import CausalLM, DecoderLayer
from tandem.engine.models.layers import feed_forward
from tandem.engine.models.layers.mla import MlaAttention


def mlp_for_layer(arch: ModelArch, index: int) -> nn.Module:
    """The feed-forward of decoder layer ``index``: the MoE block on ``arch.moe``'s sparse
    layers, the dense gated MLP elsewhere."""
    return feed_forward(arch, index)


class MlaCausalLM(CausalLM):
    """CausalLM whose layers attend with MLA; ``forward`` and ``compute_logits`` as its."""

    def make_layer(self, arch: ModelArch, index: int, window: int | None) -> nn.Module:
        return DecoderLayer(arch, window, index, attn=MlaAttention(arch),
                            mlp=mlp_for_layer(arch, index))
