"""A 3-layer, 64-wide random checkpoint of any transformers ``model_type`` (config overrides
given), every parameter non-trivial (tandem.engine.testing.perturb_parameters): for the
sliding-window tests, which need model types and sizes make_tiny_checkpoint does not take."""

from __future__ import annotations

from pathlib import Path

import torch

from tandem.engine.testing.perturb import perturb_parameters


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
    perturb_parameters(model)
    model.save_pretrained(path)
    return path
