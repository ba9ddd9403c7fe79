"""Tiny random PEFT LoRA adapters for tests, written by the ``peft`` package itself.

Every B matrix is random and non-zero (PEFT's default starts B at zero, which would make an
adapter a no-op and a comparison that cannot fail), so each adapter visibly moves the base
model's output; the directory is what ``save_pretrained`` writes (adapter_config.json +
adapter_model.safetensors), read by the engine exactly as a user's adapter would be.
``write_random_adapter`` writes the same layout with safetensors alone, for machines without
``peft`` (the lent GPU machines' image).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_tiny_adapter(base: str | Path, out: str | Path, rank: int = 4, alpha: float = 8.0,
                      targets: Sequence[str] = ALL_TARGETS, seed: int = 0,
                      use_rslora: bool = False, scale: float = 0.2) -> Path:
    """A PEFT LoRA adapter for the checkpoint at ``base``, A and B drawn from ``seed``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets),
                        lora_dropout=0.0, bias="none", use_rslora=use_rslora,
                        task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    path = Path(out)
    peft_model.save_pretrained(path)
    return path


def peft_greedy(base: str | Path, adapter: str | Path | None, prompt: list[int],
                max_new_tokens: int) -> list[int]:
    """Greedy continuation under PEFT's adapter (None: the base model), EOS ignored."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter)).eval()
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
    with torch.inference_mode():
        out = model.generate(input_ids=torch.tensor([prompt]),
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             generation_config=config)
    return out[0, len(prompt):].tolist()


def write_random_adapter(base: str | Path, out: str | Path, rank: int, seed: int,
                         targets: Sequence[str] = ALL_TARGETS, alpha: float | None = None,
                         scale: float = 0.2) -> Path:
    """A random LoRA adapter directory in PEFT's saved layout for the checkpoint at ``base``
    (A and B drawn from ``seed`` times ``scale``; ``lora_alpha`` 2 r unless given), written
    without ``peft``."""
    from safetensors.torch import save_file

    cfg = json.loads((Path(base) / "config.json").read_text())
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    dims = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for m in targets:
            part = "self_attn" if m in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            key = f"base_model.model.model.layers.{layer}.{part}.{m}"
            fan_in, fan_out = dims[m]
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, fan_in, generator=g) * scale
            tensors[f"{key}.lora_B.weight"] = torch.randn(fan_out, rank, generator=g) * scale
    path = Path(out)
    path.mkdir(parents=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank if alpha is None else alpha,
         "bias": "none", "target_modules": list(targets)}))
    return path


def greedy_under_adapters(engine: Any, jobs: Sequence[tuple[list[int], str, int]]
                          ) -> list[list[int]]:
    """Greedy tokens of each job (prompt ids, adapter name or "" for the base, max tokens),
    all queued on ``engine`` (an LLMEngine) at once and stepped to the end: mixed adapters
    in one batch."""
    from tandem.engine.sampling_params import SamplingParams

    ids = [engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=m,
                                                ignore_eos=True, lora=lora))
           for p, lora, m in jobs]
    done: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.token_ids
    return [done[i] for i in ids]
