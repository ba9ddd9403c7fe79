"""transformers' generate(), the reference our engine must match token for token, and the
helper that runs our engine to completion for the comparison."""

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


def hf_prompt_logprobs(path: Path, prompt: list[int], dtype=torch.float32) -> torch.Tensor:
    """log_softmax (fp32) of transformers' logits at every prompt position ``[len(prompt), V]``:
    row p scores token p + 1."""
    from transformers import AutoModelForCausalLM

    key = (str(path), dtype)
    if key not in _MODELS:  # the same entry hf_greedy makes
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
        model.generation_config.eos_token_id = None
        _MODELS[key] = model
    with torch.inference_mode():
        logits = _MODELS[key](torch.tensor([prompt])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


def engine_token_ids(engine, prompts: list, params) -> list[list[int]]:
    """Submit every prompt (ids or text) with ``params``, step the engine until all finish and
    return each request's generated token ids, in prompt order."""
    ids = [engine.add_request(p, params) for p in prompts]
    got: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                got[out.request_id] = out.token_ids
    return [got[i] for i in ids]
