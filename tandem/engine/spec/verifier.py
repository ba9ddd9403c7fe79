"""Verification: turn the target's k+1 rows per speculating request into emitted tokens.

    rows of one request:  r0 = after [.., last]   r1 = after [.., last, d1]  ...  rk
    match (greedy, or any deterministic proposer):  x_i = the sampler's pick on r_i given the
        prefix d1..di; accept d_{i+1} while x_i == d_{i+1}; emit the accepted drafts and the
        first x_i that differs (or the bonus x_k).
    rejection (a draft model's sampled drafts): ``rejection_sample`` with p from r_i, q from
        the draft.

A constrained request (structured outputs) is always verified by match: row i's grammar mask
is its state after d1..di, so a draft the grammar refuses is never accepted.

Match is exact for one-hot q: drawing x ~ p and accepting d when x == d emits d with
probability p(d) and any other y with p(y), exactly rejection sampling's law. It also keeps a
seeded request's stream: its generator is rewound to one draw per emitted token, so the output
equals non-speculative sampling with the same seed (up to logits rounding).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.scheduler import ScheduledRequest
from tandem.engine.outputs import SampleResult
from tandem.engine.sampler import Sampler, SamplingState, _uniform, _with_logprobs
from tandem.engine.spec.probs import filtered_probs
from tandem.engine.spec.proposer import Proposer
from tandem.engine.spec.rejection import rejection_sample


@dataclass(slots=True)
class SpecStats:
    """Counters since the engine started (request-steps that were granted draft slots)."""

    proposed: int = 0
    accepted: int = 0
    steps: int = 0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed draft tokens."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens a speculating request emits per step (1 without speculation)."""
        return 1.0 + self.accepted / self.steps if self.steps else 0.0


class SpecDecoder:
    """Runs a proposer before the target forward and verifies its drafts after it."""

    def __init__(self, proposer: Proposer, sampler: Sampler, seed: int) -> None:
        self.proposer = proposer
        self.sampler = sampler
        self.stats = SpecStats()
        self._q: dict[str, torch.Tensor | None] = {}  # this step's draft distributions
        self._generator = torch.Generator().manual_seed(seed + 1)

    def propose(self, scheduled: Sequence[ScheduledRequest], kv: KVCacheManager) -> None:
        """Fill ``spec_token_ids`` of every scheduled request granted draft slots."""
        batch = [s for s in scheduled if s.num_lookahead]
        if not batch:
            return
        for s, prop in zip(batch, self.proposer.propose(batch, kv), strict=True):
            s.spec_token_ids = prop.token_ids[: s.num_lookahead]
            q = prop.probs
            self._q[s.request.request_id] = q[: len(s.spec_token_ids)] if q is not None else None
            self.stats.proposed += len(s.spec_token_ids)
            self.stats.steps += 1

    def release(self, request_id: str) -> None:
        """Forget a finished or aborted request."""
        self.proposer.release(request_id)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write of forked sequences, in the proposer's own cache if it keeps one."""
        self.proposer.copy_blocks(pairs)

    def sample(
        self,
        logits: torch.Tensor,  # [rows, V]: 1 + len(spec_token_ids) consecutive rows each
        samplers: Sequence[ScheduledRequest],
        states: Sequence[SamplingState],
    ) -> list[list[SampleResult]]:
        """Tokens to emit per sampling request, in order (the first ``len - 1`` of a
        speculating request's tokens are its accepted drafts)."""
        row_idx: list[int] = []
        row_states: list[SamplingState] = []
        # (q or None for match, first row, first row in row_idx)
        plan: list[tuple[torch.Tensor | None, int, int]] = []
        off = 0
        for s, st in zip(samplers, states, strict=True):
            drafts = s.spec_token_ids
            q = self._q.pop(s.request.request_id, None)
            if not drafts or st.params.greedy or st.constraint is not None:
                q = None  # match: exact for any q; a constrained row's masks live in the sampler
            plan.append((q, off, len(row_idx)))
            if q is None:
                row_idx.extend(range(off, off + len(drafts) + 1))
                row_states.extend(_prefixed(st, drafts))
            off += len(drafts) + 1
        rewind = {
            i: st.generator.get_state()
            for i, (s, st) in enumerate(zip(samplers, states, strict=True))
            if s.spec_token_ids and st.generator is not None and not st.params.greedy
        }
        picked: list[SampleResult] = []
        if row_idx:
            rows = logits if len(row_idx) == logits.shape[0] else logits[torch.tensor(row_idx)]
            picked = self.sampler(rows, row_states)
        out: list[list[SampleResult]] = []
        for i, (s, st) in enumerate(zip(samplers, states, strict=True)):
            q, first, j = plan[i]
            drafts = s.spec_token_ids
            if q is None:
                res = picked[j : j + len(drafts) + 1]
                n = 1
                while n <= len(drafts) and res[n - 1].token_id == drafts[n - 1]:
                    n += 1
                res = res[:n]
                if i in rewind:  # one draw per emitted token, as without speculation
                    st.generator.set_state(rewind[i])  # type: ignore[union-attr]
                    for _ in range(n):
                        _uniform(st.generator)  # type: ignore[arg-type]
            else:
                res = self._rejection(logits[first : first + len(drafts) + 1], st, drafts, q)
            self.stats.accepted += len(res) - 1
            out.append(res)
        return out

    def _rejection(
        self, rows: torch.Tensor, st: SamplingState, drafts: list[int], q: torch.Tensor
    ) -> list[SampleResult]:
        prefixed = _prefixed(st, drafts)
        p = filtered_probs(rows.cpu(), prefixed, penalize=True)  # [m+1, V]
        gen = st.generator or self._generator
        tokens = rejection_sample(p, q.to(p.device, torch.float32), drafts, lambda: _uniform(gen))
        return _with_logprobs(rows[: len(tokens)].cpu(), tokens, [st.params] * len(tokens))


def _prefixed(st: SamplingState, drafts: list[int]) -> list[SamplingState]:
    """One state per row: row i sees the output so far plus drafts d1..di."""
    return [
        SamplingState(st.params, st.prompt_token_ids, st.output_token_ids + drafts[:i],
                      st.generator, st.eos_token_ids, st.constraint)
        for i in range(len(drafts) + 1)
    ]
