"""Iteration-level continuous batching under a token budget.

Each step:
  1. running requests, oldest first, each get their next tokens (1 for decode, or the next
     prefill chunk); when blocks run out, the newest running request is preempted (its blocks
     freed, to be recomputed later) until the older one fits;
  2. then waiting requests are admitted, oldest first, with their prefix-cache hits, while
     the token budget, max_num_seqs and free blocks allow (nothing is admitted in a step that
     had to preempt).
A step carries at most ``max_loras`` distinct LoRA adapters: a running request under one
more sits the step out, a waiting one waits (base-model rows always fit).
A prompt longer than the remaining budget is split into chunks (chunked prefill); a request
samples only in the step that computes its last known token. A forked request (``num_forks``
> 1) is admitted as that many rows; its sequences join ``running`` when it forks (the
engine calls ``admit_running``) and are preempted, aborted and finished one by one.

Speculative decoding: a running request in decode state (one token to compute) also gets
``num_lookahead`` extra slots for draft tokens, budget and blocks permitting (never preempting
for them). After verification ``accept_speculation`` rolls back the rejected positions:

    slots:  [ ... | last | d1 | d2 | d3 ]   accepted d1  ->  num_computed ends after d1;
                                            blocks wholly past it go back to the pool
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from tandem.engine.config import SchedulerConfig
from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.request import Request, RequestStatus


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step."""

    request: Request
    num_new_tokens: int
    start: int  # position of the first new token (= tokens already computed)
    num_lookahead: int = 0  # slots reserved past the request's tokens for draft tokens
    spec_token_ids: list[int] = field(default_factory=list)  # drafts to verify (<= lookahead)

    @property
    def num_query_tokens(self) -> int:
        """Rows this request adds to the forward: its new tokens, then its draft tokens."""
        return self.num_new_tokens + len(self.spec_token_ids)

    @property
    def samples(self) -> bool:
        """True when this step computes the request's last known token, so it samples."""
        return self.start + self.num_new_tokens == self.request.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    """What one step runs."""

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    unschedulable: list[Request] = field(default_factory=list)  # can never fit the pool

    @property
    def num_tokens(self) -> int:
        """Total new tokens in the step."""
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    """Chooses every step's batch; owns the waiting queue and the running list."""

    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVCacheManager,
        num_spec_tokens: int = 0,
        max_model_len: int = 0,
        max_loras: int = 0,
    ) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.budget = config.max_num_batched_tokens
        self.chunked = config.enable_chunked_prefill
        self.chunk_cap = config.long_prefill_token_threshold or config.max_num_batched_tokens
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.num_spec_tokens = num_spec_tokens  # 0: no speculation
        self.max_model_len = max_model_len  # 0: unbounded (drafts never pass it)
        self.max_loras = max_loras  # distinct LoRA adapters one step may carry (0: no bound)

    def add(self, request: Request) -> None:
        """Queue a new request."""
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def admit_running(self, request: Request) -> None:
        """Put a request whose KV is already in the cache straight into the running list."""
        request.status = RequestStatus.RUNNING
        self.running.append(request)

    def remove(self, request: Request) -> None:
        """Drop a request from whichever queue holds it (abort or finish)."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)

    def schedule(self) -> SchedulerOutput:
        """Pick this step's batch."""
        out = SchedulerOutput()
        budget = self.budget
        adapters: set[str] = set()  # the LoRA adapters this step carries so far
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget, self.chunk_cap)
            if n <= 0 or not self._adapter_fits(req, adapters):
                i += 1  # (an adapter past --max-loras: the request waits for a later step)
                continue
            k = self._lookahead(req, n, budget)
            if k and self.kv.allocate_slots(req, n + k):
                out.scheduled.append(
                    ScheduledRequest(req, n, req.num_computed_tokens, num_lookahead=k)
                )
                budget -= n + k
                i += 1
                continue
            while not self.kv.allocate_slots(req, n):
                victim = self.running.pop()
                self._preempt(victim, out)
                if victim is req:
                    break
            else:
                out.scheduled.append(ScheduledRequest(req, n, req.num_computed_tokens))
                budget -= n
                i += 1
                continue
            break  # req itself was preempted: nothing older is left to schedule

        while self.waiting and budget > 0 and not out.preempted:
            req = self.waiting[0]
            # a forked request becomes num_forks rows once its prompt is computed; alone in
            # the batch it goes in whatever its n, so it never waits forever
            if self.running and len(self.running) + req.num_forks > self.max_num_seqs:
                break
            if not self._adapter_fits(req, adapters):
                break
            if self.kv.blocks_needed(req.num_tokens + 1) > self.kv.pool.num_blocks:
                self.waiting.popleft()
                out.unschedulable.append(req)
                continue
            # a prompt being scored needs logits at every position: compute it all (its
            # blocks still enter the cache for others)
            computed, num_hit = ([], 0) if req.scores_prompt else self.kv.get_computed_blocks(req)
            remaining = req.num_tokens - num_hit
            if not self.chunked and remaining > budget:
                break
            n = min(remaining, budget, self.chunk_cap)
            if not self.kv.allocate_slots(req, n, computed):
                break
            self.waiting.popleft()
            req.num_computed_tokens = num_hit
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_hit
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.scheduled.append(ScheduledRequest(req, n, num_hit))
            budget -= n
        return out

    def _adapter_fits(self, req: Request, adapters: set[str]) -> bool:
        """Whether ``req``'s LoRA adapter fits the step's ``max_loras`` distinct adapters
        (noting it in ``adapters`` when it does); the base model always fits."""
        if not req.lora or not self.max_loras or req.lora in adapters:
            return True
        if len(adapters) >= self.max_loras:
            return False
        adapters.add(req.lora)
        return True

    def _lookahead(self, req: Request, n: int, budget: int) -> int:
        """Draft slots for a request in decode state: k, less what max_tokens, the context
        length or the budget leave room for."""
        if not self.num_spec_tokens or not req.params.speculative or req.hold_kv or n != 1:
            return 0
        if req.num_tokens - req.num_computed_tokens != 1:
            return 0
        k = min(self.num_spec_tokens, budget - n, req.params.max_tokens - req.num_output_tokens - 1)
        if self.max_model_len:
            k = min(k, self.max_model_len - req.num_tokens)
        return max(0, k)

    def accept_speculation(self, s: ScheduledRequest, num_accepted: int) -> None:
        """Roll back after verification: the first ``num_accepted`` drafts keep their KV (the
        step already counted ``num_new_tokens``), the rest are forgotten and blocks that lie
        wholly past the kept positions are freed."""
        req = s.request
        req.num_computed_tokens = s.start + s.num_new_tokens + num_accepted
        if not req.status.finished:
            self.kv.trim(req.request_id, req.num_computed_tokens)

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self.kv.free(req.request_id)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(req)
        self.num_preemptions += 1
        out.preempted.append(req.request_id)

    def num_unfinished(self) -> int:
        """Requests waiting or running."""
        return len(self.waiting) + len(self.running)

    def pending_prefill_tokens(self) -> int:
        """Prompt tokens still to compute, queued or mid-prefill (what a new prompt waits
        behind); a decoding request's one next token is not counted."""
        waiting = sum(r.num_tokens - r.num_computed_tokens for r in self.waiting)
        running = sum(max(r.num_tokens - r.num_computed_tokens - 1, 0) for r in self.running)
        return waiting + running
