"""transformers' generate(), the reference our engine must match token for token."""

from __future__ import annotations

from pathlib import Path

import torch

_MODELS: dict[tuple[str, torch.dtype], torch.nn.Module] = {}


def hf_greedy(path: Path, prompt: list[int], max_new_tokens: int, dtype=torch.float32) -> list[int]:
    """Greedy continuation of one prompt (batch 1, no padding), EOS ignored."""
    from transformers import AutoModelForCausalLM

    key = (str(path), dtype)
    if key not in _MODELS:
        _MODELS[key] = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    model = _MODELS[key]
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()
