"""The decoder-only forward over the paged KV cache (Llama, Mistral, Qwen2, Qwen3; with
mixture-of-experts layers: Mixtral, Qwen2-MoE, Qwen3-MoE).

Tokens arrive flattened (``[T]``, see tandem/engine/attention/base.py); every layer writes its new
K/V into the cache through the attention backend and attends over the paged context. Q/K/V and
gate/up are fused into one matmul each. What differs between the families is in the arch's
features (biases, q/k norms: tandem/engine/models/arch.py), read by the shared layers
(tandem/engine/models/layers). Numerics follow transformers (RMSNorm in fp32, RoPE tables in
fp32 cast to the activation dtype) so greedy decoding matches ``generate()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from tandem.engine.attention.base import AttentionBackend, AttentionMetadata
from tandem.engine.models.arch import ModelArch
from tandem.engine.models.layers import Attention, RMSNorm, feed_forward
from tandem.engine.models.linear import Linear
from tandem.engine.models.windows import layer_windows

if TYPE_CHECKING:  # tandem.engine.quant imports this module
    from tandem.engine.quant.kv_scales import CheckpointKvScales


class DecoderLayer(nn.Module):
    """Pre-norm transformer block (attending through a sliding window of ``window``
    positions when it is set). Layer ``index``'s feed-forward is a mixture of experts where
    the arch makes it sparse (layers/moe.py), else the dense MLP; a family may give its own
    attention and feed-forward modules instead (mla_lm.py)."""

    def __init__(self, arch: ModelArch, window: int | None = None, index: int = 0,
                 attn: nn.Module | None = None, mlp: nn.Module | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.self_attn = attn if attn is not None else Attention(arch, window)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.mlp = mlp if mlp is not None else feed_forward(arch, index)

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


class CausalLM(nn.Module):
    """The whole model; ``forward`` returns hidden states, ``compute_logits`` the vocab scores."""

    # How the checkpoint's weights were stored: "none" (float), or the pre-quantized format
    # the loader read, e.g. "awq-int4-g128" (tandem/engine/quant/prequantized; set by load_model).
    quant_format: str = "none"
    # The format of a checkpoint whose weights were dequantized at load (an FP8 one:
    # "fp8-block128x128"), None otherwise; --quantization fp8 requires one, or an FP8
    # quant_format (its linears kept in e4m3 for the native CPU kernels).
    dequantized_from: str | None = None
    # Calibrated fp8 KV scales the checkpoint carries, per layer (k_scale/v_scale), None
    # when it has none (tandem/engine/quant/kv_scales.py; set by load_model).
    kv_scales: CheckpointKvScales | None = None

    def __init__(self, arch: ModelArch, cos: torch.Tensor, sin: torch.Tensor) -> None:
        super().__init__()
        self.arch = arch
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(self.make_layer(arch, i, w)
                                    for i, w in enumerate(layer_windows(arch)))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.lm_head = Linear(arch.hidden_size, arch.vocab_size, bias=False)
        if arch.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("cos_table", cos, persistent=False)  # [P, hd] fp32
        self.register_buffer("sin_table", sin, persistent=False)

    def make_layer(self, arch: ModelArch, index: int, window: int | None) -> nn.Module:
        """Decoder layer ``index`` (a family's forward overrides this: mla_lm.py)."""
        return DecoderLayer(arch, window, index)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_cache: torch.Tensor,  # [L, 2, num_blocks, bs, Hkv, hd] (MLA: [L, 1, ..., 1, W])
        meta: AttentionMetadata,
        backend: AttentionBackend,
        layer_hook: LayerHook | None = None,
    ) -> torch.Tensor:  # [T, hidden]
        h = self.embed_tokens(input_ids)
        cos = self.cos_table[positions].to(h.dtype)[:, None, :]  # [T, 1, rotary dims]
        sin = self.sin_table[positions].to(h.dtype)[:, None, :]
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, kv_cache[i], meta, backend.for_layer(i))
            if layer_hook is not None:
                layer_hook(i)  # layer i's KV for this step is now in the cache
        return self.norm(h)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [n, hidden] -> [n, V]
        """Vocabulary logits in fp32 for the rows that sample."""
        return self.lm_head(hidden).float()
