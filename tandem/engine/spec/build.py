"""Build the engine's speculative decoder from its config (``NoSpecDecoder`` when it is off)."""

from __future__ import annotations

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


def build_spec_decoder(
    spec: SpeculativeConfig,
    target: nn.Module,
    arch: ModelArch,
    rc: RunnerConfig,
    sampler: Sampler,
    seed: int,
    cache_dir: str | None,
) -> SpecDecoder | NoSpecDecoder:
    """The proposer named by ``spec`` behind a ``SpecDecoder``; ``rc`` is the target's."""
    if not spec.enabled:
        return NoSpecDecoder(sampler)
    proposer: Proposer
    if spec.speculative_method == "ngram":
        proposer = NgramProposer(spec.ngram_max, spec.ngram_min, spec.num_speculative_tokens)
    else:
        model, draft_arch = build_draft(
            target, arch, spec.draft_model, spec.draft_layers, rc, cache_dir
        )
        proposer = DraftProposer(model, draft_arch, rc, seed)
    return SpecDecoder(proposer, sampler, seed)
