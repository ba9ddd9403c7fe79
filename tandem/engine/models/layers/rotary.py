"""Rotary position embeddings: fp32 tables built once, applied in the activation dtype.

We borrow transformers' rotary module for ``inv_freq`` and ``attention_scaling`` (it knows
default, linear, llama3 and yarn scaling: the RoPE types the family specs accept), then
tabulate ``cos(pos * inv_freq)`` once for every position the engine serves.
"""

from __future__ import annotations

from typing import Any

import torch


def rotary_tables(config: Any, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos/sin tables ``[max_positions, head_dim]``, exactly as transformers builds them."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rotary = LlamaRotaryEmbedding(config=config)
    inv_freq = rotary.inv_freq.float()  # [head_dim / 2]
    pos = torch.arange(max_positions, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]  # [P, head_dim / 2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [P, head_dim]
    scale = float(rotary.attention_scaling)
    return emb.cos() * scale, emb.sin() * scale


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` ``[T, heads, hd]`` rotated by position (``cos``/``sin`` ``[T, 1, hd]``), in the
    half-split layout Hugging Face checkpoints use."""
    return x * cos + _rotate_half(x) * sin


def apply_rotary_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` ``[T, heads, d]`` rotated in DeepSeek's layout: the pairs (x0, x1), (x2, x3), ...
    each turn by one frequency (``cos``/``sin`` ``[T, 1, d]`` as tabulated above: their first
    half holds the per-pair angles). The result lists the pairs' first elements, then their
    second ones, as transformers' DeepSeek-V3 ``apply_rotary_pos_emb_interleave`` does;
    DeepSeek-V2's complex-number form keeps them interleaved, a permutation that queries and
    keys share, so every dot product, and the attention, is the same."""
    half = cos.shape[-1] // 2
    c, s = cos[..., :half], sin[..., :half]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
