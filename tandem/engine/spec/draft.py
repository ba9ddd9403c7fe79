"""The draft-model proposer: a small model guesses k tokens autoregressively.

Its KV lives in its own paged cache indexed by the *target's* block tables (same block ids,
same block size), so it needs no allocator of its own; blocks the target rolls back or frees
simply stop being read. After a prefill worker's handoff the draft has no KV for the prompt:
its first proposal runs a draft prefill over prompt + output on the decode worker (see
docs/speculative.md for why it is built there and not shipped).

In a tensor-parallel group the draft is a checkpoint of its own, loaded whole on rank 0 (no
rank holds a shard of it, none all-reduces for it); its cache is rank 0's alone, and the
followers never see it. The target's verify pass over the drafts is an ordinary multi-token
step, which rank 0 sends to every rank like any other (tandem/engine/parallel/group.py).

    step: catch-up chunk  tokens[computed : n]  -> q1, d1      (one forward, all requests)
          then k-1 decode passes  d_i at position n+i-1 -> q_{i+1}, d_{i+1}
    next step: draft KV is valid up to the first draft the target rejected.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from tandem.engine.attention import AttentionMetadata, get_backend
from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.scheduler import ScheduledRequest
from tandem.engine.model_runner import copy_kv_blocks
from tandem.engine.models.arch import ModelArch
from tandem.engine.runner_config import RunnerConfig
from tandem.engine.sampler import SamplingState, _uniform, greedy
from tandem.engine.spec.probs import draw, filtered_probs
from tandem.engine.spec.proposer import Proposal


@dataclass(slots=True)
class _DraftState:
    """What the draft cache holds for one request: real tokens below ``base``, then ``fed``."""

    base: int
    fed: list[int] = field(default_factory=list)
    preemptions: int = 0

    def valid(self, tokens: list[int]) -> int:
        """Positions whose draft KV matches ``tokens`` (fed drafts count while accepted)."""
        n = self.base
        for d in self.fed:
            if n >= len(tokens) or tokens[n] != d:
                break
            n += 1
        return n


class DraftProposer:
    """Proposes with a draft model over its own paged KV cache."""

    def __init__(self, model: nn.Module, arch: ModelArch, rc: RunnerConfig, seed: int) -> None:
        """``rc``: the target's runner config (same blocks and block size; the draft's own
        cache is always in the model dtype)."""
        self.model = model
        self.block_size = rc.block_size
        self.device = rc.device
        self.backend = get_backend(rc.backend)
        # [layers, K/V, blocks, block_size, kv heads, head dim], like the target's (an MLA
        # draft: one latent plane and head)
        self.kv_cache = torch.zeros(
            arch.num_layers, arch.kv_planes, rc.num_blocks, rc.block_size, arch.kv_cache_heads,
            arch.kv_cache_dim, dtype=rc.dtype, device=rc.device,
        )
        self._states: dict[str, _DraftState] = {}
        self._generator = torch.Generator().manual_seed(seed)
        self._seeded: dict[str, torch.Generator] = {}  # a seeded request's own draft RNG

    def release(self, request_id: str) -> None:
        """Forget a request (its blocks, and so its draft KV, are the target's to free)."""
        self._states.pop(request_id, None)
        self._seeded.pop(request_id, None)

    @torch.inference_mode()
    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """The target's copy-on-write, mirrored in the draft cache (same block ids)."""
        copy_kv_blocks(self.kv_cache, pairs)

    @torch.inference_mode()
    def propose(self, batch: list[ScheduledRequest], kv: KVCacheManager) -> list[Proposal]:
        """k_i draft tokens per request (k_i = its lookahead), with the q each came from."""
        chunks: list[tuple[list[int], int, list[int]]] = []
        for s in batch:
            req = s.request
            tokens = req.all_token_ids
            st = self._states.get(req.request_id)
            computed = 0
            if st is not None and st.preemptions == req.num_preemptions:
                computed = min(st.valid(tokens), len(tokens) - 1)
            chunks.append((tokens[computed:], computed, kv.block_ids(req.request_id)))
        drafts: list[list[int]] = [[] for _ in batch]
        qs: list[list[torch.Tensor]] = [[] for _ in batch]
        live = list(range(len(batch)))
        for i in range(max(s.num_lookahead for s in batch)):
            logits = self._forward([chunks[j] for j in live])  # [len(live), V]
            self._pick(logits, [batch[j] for j in live], [drafts[j] for j in live],
                       [qs[j] for j in live])
            live = [j for j in live if len(drafts[j]) < batch[j].num_lookahead]
            for j in live:  # next pass feeds the draft just picked, one position further
                n = batch[j].request.num_tokens
                chunks[j] = ([drafts[j][-1]], n + i, chunks[j][2])
        out = []
        for s, d, q in zip(batch, drafts, qs, strict=True):
            req = s.request
            # fed to the draft: every draft but the last (its KV is never written)
            self._states[req.request_id] = _DraftState(req.num_tokens, d[:-1],
                                                       req.num_preemptions)
            out.append(Proposal(d, torch.stack(q) if q else None))
        return out

    def _pick(
        self,
        logits: torch.Tensor,
        batch: list[ScheduledRequest],
        drafts: list[list[int]],
        qs: list[list[torch.Tensor]],
    ) -> None:
        """Append one draft per row: argmax for greedy requests, else a draw from q."""
        picks = greedy(logits).tolist()
        rows = [i for i, s in enumerate(batch) if not s.request.params.greedy]
        if rows:
            states = [
                SamplingState(batch[i].request.params, [], [], None, frozenset()) for i in rows
            ]
            q = filtered_probs(logits[torch.tensor(rows)].cpu(), states, penalize=False)
        for i, s in enumerate(batch):
            if s.request.params.greedy:
                drafts[i].append(picks[i])
        for r, i in enumerate(rows):
            drafts[i].append(draw(q[r], _uniform(self._rng(batch[i]))))
            qs[i].append(q[r])

    def _rng(self, s: ScheduledRequest) -> torch.Generator:
        """A seeded request drafts from its own generator, so its output is reproducible."""
        seed = s.request.params.seed
        if seed is None:
            return self._generator
        rid = s.request.request_id
        if rid not in self._seeded:
            self._seeded[rid] = torch.Generator().manual_seed(seed ^ 0x5EC0DE)
        return self._seeded[rid]

    def _forward(self, chunks: list[tuple[list[int], int, list[int]]]) -> torch.Tensor:
        """Run chunks (tokens, first position, block table); logits of each last row."""
        order = sorted(range(len(chunks)), key=lambda j: len(chunks[j][0]) != 1)
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        tables: list[list[int]] = []
        qlens: list[int] = []
        slens: list[int] = []
        last: list[int] = []
        for j in order:
            toks, start, table = chunks[j]
            ids.extend(toks)
            positions.extend(range(start, start + len(toks)))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + len(toks)))
            tables.append(table)
            qlens.append(len(toks))
            slens.append(start + len(toks))
            last.append(len(ids) - 1)
        dev = self.device
        meta = AttentionMetadata.build(qlens, slens, tables, slots, bs, dev)
        hidden = self.model(
            torch.tensor(ids, dtype=torch.int64, device=dev),
            torch.tensor(positions, dtype=torch.int64, device=dev),
            self.kv_cache, meta, self.backend,
        )
        logits = self.model.compute_logits(hidden[torch.tensor(last, device=dev)])
        inverse = [0] * len(order)
        for row, j in enumerate(order):
            inverse[j] = row
        return logits[torch.tensor(inverse, device=dev)]
