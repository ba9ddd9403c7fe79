"""Tiny random checkpoints whose every parameter is non-trivial: norms away from one, biases
non-zero. transformers' own initialisation (norms one, biases zero) would hide a norm or bias
our forward reads wrong. (tandem.engine.testing.make_tiny_checkpoint keeps norms at one.)"""

from __future__ import annotations

from pathlib import Path

import torch


def perturbed_checkpoint(path: Path, model_type: str, **config: object) -> Path:
    """Write a 3-layer, 64-wide random ``model_type`` checkpoint (config overrides in
    ``config``) to ``path`` and return it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(
        model_type, vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, rms_norm_eps=1e-6, **config,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.3 if "embed" in name else 1.0 / param.shape[1] ** 0.5)
            elif "norm" in name:
                param.copy_(1.0 + 0.3 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.1)
    model.save_pretrained(path)
    return path
