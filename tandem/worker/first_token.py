"""A prefill's answer, whichever role computed it: the first sampled token(s) and their cost.

    prefill worker (Prefill: computed, pushed) ──┐
                                                 ├──> FirstToken ──servicer──> PrefillResponse
    decode worker (PrefillLocal: computed here) ─┘

The router streams the first token from this answer (TTFT does not wait for the decode
stream); a forked request's answer carries every sequence's first token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from tandem.engine.outputs import RequestOutput, TokenLogprob


@dataclass(frozen=True, slots=True)
class FirstToken:
    """The first token of a prefill (sequence 0's), and what the prefill and push cost."""

    token_id: int
    logprob: TokenLogprob | None  # when asked for
    cached_tokens: int  # prompt tokens served from the prefix cache
    prefill_s: float  # from arrival to the first token
    transfer_s: float = 0.0  # the push (0: prefilled where it decodes)
    # one per prompt token when asked for (``prompt_logprob_list``), else empty
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    # a forked request's sequences 1..n-1: their first tokens (and logprobs when asked)
    forked: list[tuple[int, TokenLogprob | None]] = field(default_factory=list)

    @classmethod
    def of(cls, outs: Sequence[RequestOutput], prefill_s: float, transfer_s: float = 0.0
           ) -> FirstToken:
        """The answer from each sequence's first output (sequence 0 first); every output
        must carry a token."""
        out = outs[0]
        return cls(out.new_token_ids[0], first_logprob(out), out.num_cached_tokens, prefill_s,
                   transfer_s, prompt_logprob_list(out.prompt_logprobs, out.prompt_token_ids),
                   [(o.new_token_ids[0], first_logprob(o)) for o in outs[1:]])


def first_logprob(out: RequestOutput) -> TokenLogprob | None:
    """The logprob of an output's first new token (None when none was asked for)."""
    return out.logprobs[0] if out.logprobs else None


def prompt_logprob_list(
    logprobs: Sequence[TokenLogprob | None] | None, prompt_ids: Sequence[int]
) -> list[TokenLogprob]:
    """Prompt logprobs as sent: one per prompt token, the first (nothing precedes it) NaN;
    empty when none were asked for."""
    if not logprobs:
        return []
    out = [lp for lp in logprobs if lp is not None]
    if logprobs[0] is None and prompt_ids:
        out.insert(0, TokenLogprob(token_id=prompt_ids[0], logprob=math.nan))
    return out
