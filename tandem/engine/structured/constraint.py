"""One request's grammar state: which tokens may come next, fed every token it emits.

The engine's tokens arrive after sampling (``accept``); the sampler asks for the mask of a
row whose state is the accepted tokens plus a few pending ones (a speculative step's drafts
d1..di): ``fill`` accepts those tentatively, writes the mask and rolls them back. A draft the
grammar refuses makes its later rows unreachable (verification stops at the first mismatch),
so their masks are left as the refusal point's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import xgrammar as xgr


class Constraint:
    """A grammar matcher for one request (not thread-safe: the engine thread owns it)."""

    def __init__(self, compiled: xgr.CompiledGrammar, label: str) -> None:
        self._matcher = xgr.GrammarMatcher(compiled)
        self.label = label  # what it enforces, for logs
        self.num_accepted = 0  # tokens fed through ``accept``

    def accept(self, token_id: int) -> bool:
        """Advance past one emitted token; False (state unchanged) when the grammar refuses
        it or has already ended."""
        if not self._matcher.accept_token(token_id):
            return False
        self.num_accepted += 1
        return True

    def allows(self, token_id: int) -> bool:
        """Whether ``token_id`` may come next (the state does not change)."""
        if not self._matcher.accept_token(token_id):
            return False
        self._matcher.rollback(1)
        return True

    def fill(self, bitmask: torch.Tensor, row: int, pending: Sequence[int] = ()) -> None:
        """Write into ``bitmask[row]`` the tokens allowed after the accepted ones and then
        ``pending`` (kept only for the call)."""
        n = 0
        for t in pending:
            if not self._matcher.accept_token(t):
                break
            n += 1
        self._matcher.fill_next_token_bitmask(bitmask, row)
        if n:
            self._matcher.rollback(n)

    @property
    def finished(self) -> bool:
        """The grammar has ended (its stop token was accepted)."""
        return bool(self._matcher.is_terminated())
