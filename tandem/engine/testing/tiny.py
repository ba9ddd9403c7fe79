"""Tiny random-weight checkpoints (Llama, Qwen2, Qwen3, Mistral; MHA or GQA; the mixture-of-
experts Mixtral, Qwen2-MoE and Qwen3-MoE with 8 experts, 2 per token; DeepSeek-V2/V3 with
multi-head latent attention, every layer dense unless ``first_k_dense_replace`` is given lower:
then the later layers are MoE, 8 routed experts (2 per token, V3 in 4 groups of which 2 are
chosen) and shared experts) for tests.

They are saved as ordinary HF directories, so the engine loads them through the same path as
a real model and transformers can serve as the reference on exactly the same weights. Every
parameter is perturbed (tandem/engine/testing/perturb.py): non-zero biases, norms away from
one. ``config`` overrides or adds config fields (``attention_bias=True``, ``rope_scaling``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tandem.engine.testing.perturb import perturb_parameters

TINY_ARCHS = ("llama", "qwen2", "qwen3", "mistral", "mixtral", "qwen2_moe", "qwen3_moe",
              "deepseek_v2", "deepseek_v3")
MLA_ARCHS = ("deepseek_v2", "deepseek_v3")


def make_tiny_checkpoint(
    path: str | Path,
    arch: str = "llama",
    num_kv_heads: int = 2,
    num_heads: int = 4,
    hidden_size: int = 64,
    num_layers: int = 2,
    vocab_size: int = 256,
    max_position_embeddings: int = 1024,
    seed: int = 0,
    tie_word_embeddings: bool = False,
    **config: Any,
) -> Path:
    """Write a random checkpoint of the given shape to ``path`` and return it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if arch not in TINY_ARCHS:
        raise ValueError(f"arch must be one of {TINY_ARCHS}")
    extra: dict[str, Any] = {}
    if arch == "mistral":
        extra["sliding_window"] = None
    if arch in ("qwen3", "qwen3_moe"):
        extra["head_dim"] = 32  # Qwen3 decouples head_dim from hidden / heads
    if arch in ("mixtral", "qwen2_moe", "qwen3_moe"):
        extra["num_experts_per_tok"] = 2
        extra["num_local_experts" if arch == "mixtral" else "num_experts"] = 8
    if arch in ("qwen2_moe", "qwen3_moe"):
        extra["moe_intermediate_size"] = hidden_size // 2
    if arch == "qwen2_moe":
        extra["shared_expert_intermediate_size"] = hidden_size
    if arch in MLA_ARCHS:
        # MLA (V2 without q-LoRA, V3 with it), every layer dense by default; transformers
        # repeats the decompressed K/V by heads / kv heads, so MLA configs have as many of each
        extra.update(kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12,
                     q_lora_rank=None if arch == "deepseek_v2" else 24,
                     first_k_dense_replace=num_layers,
                     # the MoE layers' shape, where first_k_dense_replace makes any
                     n_routed_experts=8, num_experts_per_tok=2,
                     moe_intermediate_size=hidden_size // 2,
                     n_shared_experts=2 if arch == "deepseek_v2" else 1)
        if arch == "deepseek_v3":
            extra.update(n_group=4, topk_group=2)
        num_kv_heads = num_heads
    hf_config = AutoConfig.for_model(
        arch,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        rms_norm_eps=1e-6,
        **{"intermediate_size": hidden_size * 2, **extra, **config},
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    perturb_parameters(model, seed)
    out = Path(path)
    model.save_pretrained(out)
    return out
