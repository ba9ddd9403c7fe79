"""The speculative decoder when speculation is off: the engine's step calls it all the same.

It proposes nothing, samples one token per request with the plain sampler, keeps no
per-request state and counts nothing, so the step has no ``if speculating`` branch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.scheduler import ScheduledRequest
from tandem.engine.outputs import SampleResult
from tandem.engine.sampler import Sampler, SamplingState
from tandem.engine.spec.verifier import SpecStats


class NoSpecDecoder:
    """``SpecDecoder``'s interface with nothing to speculate."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler
        self.stats = SpecStats()  # stays all zeros

    def propose(self, scheduled: Sequence[ScheduledRequest], kv: KVCacheManager) -> None:
        """No drafts: every request decodes one token."""

    def sample(
        self,
        logits: torch.Tensor,  # [n, V]: one row per sampling request
        samplers: Sequence[ScheduledRequest],
        states: Sequence[SamplingState],
    ) -> list[list[SampleResult]]:
        """One token per sampling request, in order."""
        return [[r] for r in self.sampler(logits, states)]

    def release(self, request_id: str) -> None:
        """Nothing is kept per request."""

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """No draft cache to copy blocks in."""
