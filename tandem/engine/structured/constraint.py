"""One request's grammar state: which tokens may come next, fed every token it emits.

The engine's tokens arrive after sampling (``accept``); the sampler asks for the mask of a
row whose state is the accepted tokens plus a few pending ones (a speculative step's drafts
d1..di): ``fill`` accepts those tentatively, writes the mask and rolls them back. A draft the
grammar refuses makes its later rows unreachable (verification stops at the first mismatch),
so their masks are left as the refusal point's.

A deferred grammar (``StructuredOutput.after_token``: a reasoning model's end-of-thinking
token) lets every token through until that token has been emitted, then constrains the rest:

    output:  t1 t2 ... </think> | a1 a2 ... EOS
             free (no mask)     | the grammar's masks; a1 is the matcher's first token
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import xgrammar as xgr


class Constraint:
    """A grammar matcher for one request (not thread-safe: the engine thread owns it)."""

    def __init__(self, compiled: xgr.CompiledGrammar, label: str,
                 after_token: int | None = None) -> None:
        self._matcher = xgr.GrammarMatcher(compiled)
        self.label = label  # what it enforces, for logs
        self.num_accepted = 0  # tokens fed through ``accept`` (free ones included)
        self._after = after_token
        self._open = after_token is None  # the grammar applies from here on

    def accept(self, token_id: int) -> bool:
        """Advance past one emitted token; False (state unchanged) when the grammar refuses
        it or has already ended. Before a deferred grammar opens, every token passes."""
        if not self._open:
            self._open = token_id == self._after
        elif not self._matcher.accept_token(token_id):
            return False
        self.num_accepted += 1
        return True

    def allows(self, token_id: int) -> bool:
        """Whether ``token_id`` may come next (the state does not change)."""
        if not self._open:
            return True
        if not self._matcher.accept_token(token_id):
            return False
        self._matcher.rollback(1)
        return True

    def fill(self, bitmask: torch.Tensor, row: int, pending: Sequence[int] = ()) -> None:
        """Write into ``bitmask[row]`` the tokens allowed after the accepted ones and then
        ``pending`` (kept only for the call): every token while a deferred grammar is not
        open yet, after them."""
        free = 0 if self._open else _free_prefix(pending, self._after)
        if free is None:  # the thinking goes on past the pending tokens
            bitmask[row].fill_(-1)  # every bit set: all allowed
            return
        n = 0
        for t in pending[free:]:
            if not self._matcher.accept_token(t):
                break
            n += 1
        self._matcher.fill_next_token_bitmask(bitmask, row)
        if n:
            self._matcher.rollback(n)

    @property
    def finished(self) -> bool:
        """The grammar has ended (its stop token was accepted)."""
        return self._open and bool(self._matcher.is_terminated())


def _free_prefix(pending: Sequence[int], after: int | None) -> int | None:
    """How many of ``pending`` pass before a deferred grammar opens (through the first
    ``after``), or None when it does not open within them."""
    for i, t in enumerate(pending):
        if t == after:
            return i + 1
    return None
