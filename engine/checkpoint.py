"""What an engine runs, loaded: the model, its arch, its tokenizer and its context length.

    ModelConfig.model --resolve_model (engine/loader.py)--> checkpoint directory
                      --read_arch, load_model (engine/models/weights.py)--> LlamaForCausalLM
                      --quantize_model (engine/quant), when asked--> linear layers swapped
                      --AutoTokenizer, when the checkpoint has one--> tokenizer
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.config import ModelConfig
from engine.loader import resolve_model
from engine.models.arch import ModelArch
from engine.models.llama import LlamaForCausalLM
from engine.models.weights import load_model, read_arch
from engine.quant import quantize_model
from engine.quant.gguf_q4 import gguf_source


@dataclass(slots=True)
class Checkpoint:
    """A loaded model and what the engine needs to know about it."""

    path: Path
    model: LlamaForCausalLM
    arch: ModelArch
    tokenizer: Any  # PreTrainedTokenizerBase, or None for tokenizer-less (random test) ones
    max_model_len: int  # the context the engine serves: min(asked, what the model does exactly)


def load_checkpoint(
    mc: ModelConfig, dtype: torch.dtype, device: torch.device, progress: bool = True
) -> Checkpoint:
    """Resolve, load and (when configured) quantize ``mc.model``. Raises ModelLoadError."""
    path = resolve_model(mc.model, mc.cache_dir)
    tokenizer = _load_tokenizer(path)
    hf_config, arch = read_arch(path)
    limit = arch.max_position_embeddings
    if arch.sliding_window:  # we attend over the full context: stay where that is exact
        limit = min(limit, arch.sliding_window)
    max_model_len = min(mc.max_model_len or limit, limit)
    model, arch = load_model(path, dtype, device, max_model_len, progress, (hf_config, arch))
    if mc.quantization != "none":  # engine/quant: swap the linear layers in place
        quantize_model(model, mc.quantization, gguf_source(mc.model))
    return Checkpoint(path, model, arch, tokenizer, max_model_len)


def _load_tokenizer(path: Path) -> Any:  # -> PreTrainedTokenizerBase | None
    """The checkpoint's tokenizer, or None for tokenizer-less (random test) checkpoints."""
    if not any((path / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)
