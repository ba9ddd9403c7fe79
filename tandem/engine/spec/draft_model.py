"""Where a draft model comes from: a smaller checkpoint, or the target's first layers.

The first-layers draft shares the target's weights (embeddings, the first L decoder layers,
the final norm and lm_head), so it costs no memory beyond its own KV cache; it is what tests
use, and an early-exit draft needs no second checkpoint.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from tandem.engine.attention.base import AttentionBackend, AttentionMetadata
from tandem.engine.checkpoint import served_context
from tandem.engine.errors import ModelLoadError
from tandem.engine.loader import resolve_model
from tandem.engine.models.arch import ModelArch
from tandem.engine.models.causal_lm import CausalLM
from tandem.engine.models.weights import load_model, read_arch


class FirstLayers(nn.Module):
    """The target's first ``num_layers`` layers, then its final norm and lm_head."""

    def __init__(self, target: CausalLM, num_layers: int) -> None:
        super().__init__()
        if not 1 <= num_layers <= len(target.layers):
            raise ValueError(f"draft_layers must be in 1..{len(target.layers)}, got {num_layers}")
        self.target = target
        self.num_layers = num_layers

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_cache: torch.Tensor,  # [num_layers, 2, num_blocks, bs, Hkv, hd] (the draft's own)
        meta: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:  # [T, hidden]
        t = self.target
        h = t.embed_tokens(input_ids)
        cos = t.cos_table[positions].to(h.dtype)[:, None, :]
        sin = t.sin_table[positions].to(h.dtype)[:, None, :]
        for i in range(self.num_layers):
            h = t.layers[i](h, cos, sin, kv_cache[i], meta, backend.for_layer(i))
        return t.norm(h)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits in fp32."""
        return self.target.compute_logits(hidden)


def build_draft(
    target: CausalLM,
    target_arch: ModelArch,
    draft_model: str | None,
    draft_layers: int,
    dtype: torch.dtype,
    device: torch.device,
    max_model_len: int,
    cache_dir: str | None,
) -> tuple[nn.Module, ModelArch]:
    """The draft module and its arch, in ``dtype`` on ``device``; a checkpoint must share the
    target's vocabulary and serve ``max_model_len`` (the target's context)."""
    if not draft_model:
        model = FirstLayers(target, draft_layers)
        return model, dataclasses.replace(target_arch, num_layers=draft_layers)
    path = resolve_model(draft_model, cache_dir)
    hf_config, arch = read_arch(path)
    if arch.vocab_size != target_arch.vocab_size:
        raise ModelLoadError(
            f"draft vocabulary {arch.vocab_size} != target vocabulary {target_arch.vocab_size}"
        )
    served_context(arch, max_model_len)  # the draft computes the whole context exactly
    model, arch = load_model(path, dtype, device, max_model_len, False, (hf_config, arch))
    return model, arch
