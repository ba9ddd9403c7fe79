"""N-gram prompt lookup: no model, the request's own tokens are the draft.

    prompt + output:  ... the quick brown fox jumps over ... [the quick brown]
                              └── earliest earlier match ──┘   suffix (n = 3)
    proposal:         fox jumps over   (the k tokens that followed the match)

The longest suffix (``n_max`` down to ``n_min`` tokens) that occurred earlier wins; among its
matches the earliest one, as transformers' ``prompt_lookup_num_tokens`` does. It pays where the
output copies its input: editing, quoting, summarising with citations, code refactors.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from engine.core.kv_cache_manager import KVCacheManager
from engine.core.scheduler import ScheduledRequest
from engine.spec.proposer import Proposal


def ngram_lookup(tokens: list[int] | np.ndarray, n_max: int, n_min: int, k: int) -> list[int]:
    """Up to ``k`` tokens that followed the earliest earlier occurrence of the longest suffix
    of ``tokens`` of ``n_max`` .. ``n_min`` tokens; [] when none occurred."""
    arr = np.asarray(tokens, dtype=np.int64)
    length = len(arr)
    if k <= 0:
        return []
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        suffix = arr[length - n :]
        # starts 0 .. length-1-n: every match is followed by at least one token
        windows = sliding_window_view(arr[: length - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if len(hits):
            i = int(hits[0]) + n
            return arr[i : i + k].tolist()
    return []


class NgramProposer:
    """Prompt-lookup proposer (deterministic: its q is one-hot)."""

    def __init__(self, n_max: int, n_min: int) -> None:
        self.n_max = n_max
        self.n_min = n_min

    def propose(self, batch: list[ScheduledRequest], kv: KVCacheManager) -> list[Proposal]:
        """Look each request's suffix up in its own prompt + output."""
        return [
            Proposal(ngram_lookup(s.request.all_token_ids, self.n_max, self.n_min,
                                  s.num_lookahead))
            for s in batch
        ]

    def release(self, request_id: str) -> None:
        """Stateless: nothing to forget."""
