"""Build the engine's speculative decoder from its config (None when speculation is off)."""

from __future__ import annotations

import torch
from torch import nn

from engine.models.arch import ModelArch
from engine.sampler import Sampler
from engine.spec.config import SpeculativeConfig
from engine.spec.draft import DraftProposer
from engine.spec.draft_model import build_draft
from engine.spec.ngram import NgramProposer
from engine.spec.proposer import Proposer
from engine.spec.verifier import SpecDecoder


def build_spec_decoder(
    spec: SpeculativeConfig,
    target: nn.Module,
    arch: ModelArch,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    backend: str,
    sampler: Sampler,
    seed: int,
    max_model_len: int,
    cache_dir: str | None,
) -> SpecDecoder | None:
    """The proposer named by ``spec`` behind a ``SpecDecoder``."""
    if not spec.enabled:
        return None
    proposer: Proposer
    if spec.speculative_method == "ngram":
        proposer = NgramProposer(spec.ngram_max, spec.ngram_min, spec.num_speculative_tokens)
    else:
        model, draft_arch = build_draft(
            target, arch, spec.draft_model, spec.draft_layers, dtype, device, max_model_len,
            cache_dir,
        )
        proposer = DraftProposer(
            model, draft_arch, num_blocks, block_size, dtype, device, backend, seed
        )
    return SpecDecoder(proposer, sampler, seed)
