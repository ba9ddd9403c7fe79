"""The proposer interface: guess each speculating request's next tokens.

A proposer sees the step's scheduled requests that were granted ``num_lookahead`` draft slots
(``ScheduledRequest``) and returns one ``Proposal`` each, at most ``num_lookahead`` tokens long
(possibly empty: the request then decodes one token as usual).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.scheduler import ScheduledRequest


@dataclass(slots=True)
class Proposal:
    """Draft tokens for one request, and the distribution each was drawn from.

    ``probs`` is ``[len(token_ids), V]``; None means the proposer is deterministic (a one-hot
    q), which verification by sampled match handles exactly for any target distribution."""

    token_ids: list[int]
    probs: torch.Tensor | None = None


class Proposer(Protocol):
    """Guesses draft tokens; may keep per-request state (released when a request ends)."""

    def propose(
        self, batch: list[ScheduledRequest], kv: KVCacheManager
    ) -> list[Proposal]:
        """One proposal per scheduled request, in order."""
        ...

    def release(self, request_id: str) -> None:
        """Forget a finished or aborted request's state."""
        ...

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy (src, dst) blocks in a cache indexed by the target's block tables (a forked
        sequence's copy-on-write); a proposer without one does nothing."""
        ...
