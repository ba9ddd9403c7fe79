"""Build the engine's speculative decoder from its config (``NoSpecDecoder`` when it is off)."""

from __future__ import annotations

import torch
from torch import nn

from tandem.engine.models.arch import ModelArch
from tandem.engine.runner_config import RunnerConfig
from tandem.engine.sampler import Sampler
from tandem.engine.spec.config import SpeculativeConfig
from tandem.engine.spec.draft import DraftProposer
from tandem.engine.spec.draft_model import build_draft
from tandem.engine.spec.ngram import NgramProposer
from tandem.engine.spec.null import NoSpecDecoder
from tandem.engine.spec.proposer import Proposer
from tandem.engine.spec.verifier import SpecDecoder


def load_draft(
    spec: SpeculativeConfig,
    target: nn.Module,
    arch: ModelArch,
    dtype: torch.dtype,
    device: torch.device,
    max_model_len: int,
    cache_dir: str | None,
) -> tuple[nn.Module, ModelArch] | None:
    """The draft model ``spec`` names and its arch (None: no draft model), loaded now: before
    the KV pool is sized, so the device's memory in use counts its weights
    (tandem/engine/kv_budget.py). In a tensor-parallel group rank 0 alone loads it, whole."""
    if not spec.enabled or spec.speculative_method != "draft":
        return None
    return build_draft(target, arch, spec.draft_model, spec.draft_layers, dtype, device,
                       max_model_len, cache_dir)


def build_spec_decoder(
    spec: SpeculativeConfig,
    draft: tuple[nn.Module, ModelArch] | None,
    rc: RunnerConfig,
    sampler: Sampler,
    seed: int,
) -> SpecDecoder | NoSpecDecoder:
    """The proposer named by ``spec`` behind a ``SpecDecoder``; ``draft``: ``load_draft``'s
    model (the draft method's); ``rc`` is the target's."""
    if not spec.enabled:
        return NoSpecDecoder(sampler)
    proposer: Proposer
    if spec.speculative_method == "ngram":
        proposer = NgramProposer(spec.ngram_max, spec.ngram_min, spec.num_speculative_tokens)
    else:
        assert draft is not None  # load_draft's, for the draft method
        proposer = DraftProposer(*draft, rc, seed)
    return SpecDecoder(proposer, sampler, seed)
