"""transformers' generate(), the reference our engine must match token for token."""

from __future__ import annotations

from pathlib import Path

import torch

_MODELS: dict[tuple[str, torch.dtype], torch.nn.Module] = {}


def hf_greedy(path: Path, prompt: list[int], max_new_tokens: int, dtype=torch.float32) -> list[int]:
    """Greedy continuation of one prompt (batch 1, no padding), EOS ignored."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    key = (str(path), dtype)
    if key not in _MODELS:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
        model.generation_config.eos_token_id = None  # our private copy never stops at EOS
        _MODELS[key] = model
    model = _MODELS[key]
    # No EOS at all (rather than min_new_tokens, which masks EOS out): like ignore_eos, an EOS
    # that is the argmax is emitted and generation goes on.
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            generation_config=config,
        )
    assert out.shape[1] == len(prompt) + max_new_tokens
    return out[0, len(prompt) :].tolist()
