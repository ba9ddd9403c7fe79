"""Where a prompt is prefilled: remote on a prefill worker, or locally on its decode worker.

Per request, from the workers' live signals, the router predicts for each option the new
request's TTFT and the token gap it imposes on the streams already running on the decode
worker, then picks (``decide``)::

    feasible = options with TTFT <= slo.ttft_s and decode token gap <= slo.tpot_s
    feasible      -> the one with the lowest TTFT (remote on a tie: it leaves D's compute free)
    none feasible -> the one that misses its targets by the smallest factor ("cheapest")

The cost model (numbers every worker fits from its own step times, tandem/common/step_costs.py,
and reports in Stats)::

    step(rows, tokens)  = base + per_row * rows + per_token * tokens
    remote TTFT on P    = steps(P.queued + new_P, C_P) * base_P + (P.queued + new_P) * per_token_P
                          + link(P, D, bytes)    (the push at the pair's measured link, or the
                                                  configured prior: link.py)
                          + overhead_P(blocks)   (router-measured: what the RPCs and the push
                                                  take beyond that, and the model's error on P)
    local TTFT on D     = steps(D.queued + new_D, C_D - rows_D) * (base_D + per_row_D * rows_D)
                          + (D.queued + new_D) * per_token_D
                          + overhead_D(blocks)   (router-measured: the model's error on D)
    D's token gap       = remote: step_D(rows_D + 1, 0)
                          local:  step_D(rows_D + 1, min(C_D - rows_D, D.queued + new_D))

``new_X`` is the prompt less the prefix X already caches; ``C_X`` the tokens one step may
take (its chunk budget); ``steps(n, c) = ceil(n / c)``; ``rows_D`` the streams running on D
(the larger of its report and the router's own count); ``blocks`` the KV blocks of the
prompt D lacks (what a remote prefill pushes). Both overheads are learnt the same way
(overheads.py, ``PrefillOverheads``), from each finished prefill's measured time against its
prediction at the decision, so neither option carries an error the other is spared; the
remote one's link term is priced apart (per prefill/decode pair, falling back to a prior when
unmeasured), so a slow link keeps long prompts local from the first request on. A
decode worker that never prefilled borrows the prefill worker's per-token cost (same
model); without any fitted cost the decision is the one before this model existed: remote
whenever a prefill worker exists.
Everything here is pure: no I/O, no clock; the router calls it once per request, and the
planner's simulator the same way (tandem/planner/sim/placing.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from tandem.placement.slo import Slo
from tandem.placement.worker_view import WorkerView

# Chunk budget assumed for a worker that did not report one (the engine's default).
DEFAULT_CHUNK_TOKENS = 2048
# Prefill workers the model weighs per request: the policy's best few (the decision stays
# well under 100 us; a worker further down the ranking would not be chosen anyway).
MAX_CANDIDATES = 8


class Decision(str, Enum):
    """Where the prompt goes."""

    REMOTE = "remote"
    LOCAL = "local"


class Reason(str, Enum):
    """Why (the ``reason`` label of tandem_disagg_decision_total)."""

    COLOCATED = "colocated"  # no prefill worker in the pool
    THRESHOLD = "threshold"  # the fixed --local-prefill-threshold override decided
    SLO = "slo"  # the fastest option inside both targets
    CHEAPEST = "cheapest"  # none met both targets: the smallest miss
    NO_SIGNAL = "no_signal"  # no fitted costs yet: remote, as without the model
    CONFIGURED = "configured"  # --placement remote


@dataclass(frozen=True, slots=True)
class Prediction:
    """One option's predicted figures (seconds)."""

    decision: Decision
    endpoint: str  # the prefill worker (remote) or the decode worker (local)
    ttft_s: float
    decode_gap_s: float  # the token gap running streams on the decode worker see meanwhile
    overhead_s: float = 0.0  # the learnt part of ttft_s (PrefillOverheads)
    link_s: float = 0.0  # the KV push's part of ttft_s (remote: link.LinkEstimates)

    @property
    def compute_s(self) -> float:
        """The model's compute part of ``ttft_s`` (neither the learnt overhead nor the link)."""
        return self.ttft_s - self.overhead_s - self.link_s

    @property
    def modelled_s(self) -> float:
        """Compute plus link: what a measured prefill is compared against to learn the
        overhead (the residual neither term explains)."""
        return self.ttft_s - self.overhead_s

    def miss(self, slo: Slo) -> float:
        """How far outside the targets: max of predicted / target (<= 1: inside both)."""
        return max(self.ttft_s / slo.ttft_s, self.decode_gap_s / slo.tpot_s)


@dataclass(frozen=True, slots=True)
class Placement:
    """The decision, why, and what the model predicted for it (None without a model)."""

    decision: Decision
    reason: Reason
    endpoint: str = ""  # the chosen prefill worker when remote
    predicted: Prediction | None = None


def _steps(tokens: int, budget: int) -> int:
    return max(1, math.ceil(tokens / max(budget, 1))) if tokens > 0 else 0


def _chunk(w: WorkerView) -> int:
    return w.max_batched_tokens or DEFAULT_CHUNK_TOKENS


def predict_remote(
    p: WorkerView, d: WorkerView, new_tokens: int, overhead_s: float = 0.0, link_s: float = 0.0
) -> Prediction | None:
    """Remote prefill on ``p`` for a decode leg on ``d``, its KV push costing ``link_s``;
    None without fitted costs."""
    if p.step_base_s is None or p.step_per_prefill_token_s is None:
        return None
    gap = _decode_gap(d)
    if gap is None:
        return None
    work = p.queued_prefill_tokens + new_tokens
    extra, wire = max(overhead_s, 0.0), max(link_s, 0.0)
    ttft = (_steps(work, _chunk(p)) * p.step_base_s + work * p.step_per_prefill_token_s
            + wire + extra)
    return Prediction(Decision.REMOTE, p.endpoint, ttft, gap, extra, wire)


def predict_local(d: WorkerView, new_tokens: int, borrowed_per_token_s: float | None = None,
                  overhead_s: float = 0.0) -> Prediction | None:
    """Local (chunked) prefill on ``d``, plus the router's learnt ``overhead_s`` for it; None
    without fitted costs."""
    per_token = d.step_per_prefill_token_s
    if per_token is None:
        per_token = borrowed_per_token_s
    if d.step_base_s is None or per_token is None:
        return None
    rows = _rows(d)
    per_row = d.step_per_row_s or 0.0
    budget = max(_chunk(d) - rows, 1)
    work = d.queued_prefill_tokens + new_tokens
    steps = _steps(work, budget)
    extra = max(overhead_s, 0.0)
    ttft = steps * (d.step_base_s + per_row * rows) + work * per_token + extra
    gap = d.step_base_s + per_row * (rows + 1) + per_token * min(budget, work)
    return Prediction(Decision.LOCAL, d.endpoint, ttft, gap, extra)


def _decode_gap(d: WorkerView) -> float | None:
    """D's step with one more row and no prefill (the new request once it decodes)."""
    if d.step_base_s is None:
        return None
    return d.step_base_s + (d.step_per_row_s or 0.0) * (_rows(d) + 1)


def _rows(d: WorkerView) -> int:
    """Streams running on D: reported (a heartbeat old) or this router's own count (exact)."""
    return max(d.num_running, d.active)


def weigh(prompt_tokens: int, decode: WorkerView, prefill: Sequence[WorkerView],
          cached: Mapping[str, int], overhead_s: Mapping[str, float],
          link_s: Mapping[str, float] | None = None,
          ) -> tuple[list[tuple[WorkerView, Prediction | None]], Prediction | None]:
    """The options :func:`decide` compares for a prompt of ``prompt_tokens``: each of the
    first ``MAX_CANDIDATES`` prefill workers with its remote prediction, and the local one
    (None where a side has no fitted costs). A decode worker that never prefilled borrows the
    first prefill worker's cost per token that is known (same model). ``overhead_s``: the
    learnt overheads by endpoint (the prefill workers' and the decode worker's); ``link_s``:
    each prefill worker's push of this prompt to ``decode`` (link.LinkEstimates.seconds)."""

    def new(endpoint: str) -> int:
        return max(prompt_tokens - cached.get(endpoint, 0), 1)  # the last token always runs

    links = link_s or {}
    remote = [(p, predict_remote(p, decode, new(p.endpoint), overhead_s.get(p.endpoint, 0.0),
                                 links.get(p.endpoint, 0.0)))
              for p in prefill[:MAX_CANDIDATES]]
    borrowed = next((p.step_per_prefill_token_s for p in prefill
                     if p.step_per_prefill_token_s is not None), None)
    return remote, predict_local(decode, new(decode.endpoint), borrowed,
                                 overhead_s.get(decode.endpoint, 0.0))


def decide(
    prompt_tokens: int,
    decode: WorkerView,
    prefill: Sequence[WorkerView],
    slo: Slo,
    cached: Mapping[str, int] | None = None,
    overhead_s: Mapping[str, float] | None = None,
    threshold: int = 0,
    link_s: Mapping[str, float] | None = None,
) -> Placement:
    """Place one prompt of ``prompt_tokens`` whose decode leg is on ``decode``.

    ``prefill``: candidate prefill workers, best first (policy.rank_prefill; the first
    ``MAX_CANDIDATES`` are weighed). ``cached``:
    prompt tokens each endpoint is known to hold already (prefix cache). ``overhead_s``: the
    router's measured extra seconds per endpoint (a prefill worker's remote prefills, the
    decode worker's local ones; overheads.PrefillOverheads). ``link_s``: seconds each
    prefill worker's push of this prompt to ``decode`` costs (link.LinkEstimates: measured per
    pair, or the prior). ``threshold`` > 0: the fixed override, prompts shorter than it go
    local and the rest remote, no model consulted.
    """
    if not prefill:
        return Placement(Decision.LOCAL, Reason.COLOCATED)
    if threshold > 0:
        if prompt_tokens < threshold:
            return Placement(Decision.LOCAL, Reason.THRESHOLD)
        return Placement(Decision.REMOTE, Reason.THRESHOLD, prefill[0].endpoint)
    remote, local = weigh(prompt_tokens, decode, prefill, cached or {}, overhead_s or {},
                          link_s)
    options = [pred for _, pred in remote if pred is not None]
    if local is not None:
        options.append(local)
    if not options or local is None or len(options) == 1:
        # Without a prediction for both sides there is nothing to compare.
        return Placement(Decision.REMOTE, Reason.NO_SIGNAL, prefill[0].endpoint)
    feasible = [o for o in options if o.miss(slo) <= 1.0]
    if feasible:
        best = min(feasible, key=lambda o: (o.ttft_s, o.decision is Decision.LOCAL))
        reason = Reason.SLO
    else:
        best = min(options, key=lambda o: (o.miss(slo), o.decision is Decision.LOCAL))
        reason = Reason.CHEAPEST
    endpoint = best.endpoint if best.decision is Decision.REMOTE else ""
    return Placement(best.decision, reason, endpoint, best)
