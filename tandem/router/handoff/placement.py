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
                          + overhead_P(blocks)   (router-measured: the RPCs and the KV push
                                                  the model misses, and its error on P)
    local TTFT on D     = steps(D.queued + new_D, C_D - rows_D) * (base_D + per_row_D * rows_D)
                          + (D.queued + new_D) * per_token_D
                          + overhead_D(blocks)   (router-measured: the model's error on D)
    D's token gap       = remote: step_D(rows_D + 1, 0)
                          local:  step_D(rows_D + 1, min(C_D - rows_D, D.queued + new_D))

``new_X`` is the prompt less the prefix X already caches; ``C_X`` the tokens one step may
take (its chunk budget); ``steps(n, c) = ceil(n / c)``; ``rows_D`` the streams running on D
(the larger of its report and the router's own count); ``blocks`` the KV blocks of the
prompt D lacks (what a remote prefill pushes). Both overheads are learnt the same way
(:class:`PrefillOverheads`), from each finished prefill's measured time against its
prediction at the decision, so neither option carries an error the other is spared. A
decode worker that never prefilled borrows the prefill worker's per-token cost (same
model); without any fitted cost the decision is the one before this model existed: remote
whenever a prefill worker exists.
Everything here is pure: no I/O, no clock; the router calls it once per request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from tandem.router.membership.worker_view import WorkerView

# Chunk budget assumed for a worker that did not report one (the engine's default).
DEFAULT_CHUNK_TOKENS = 2048
# Prefill workers the model weighs per request: the policy's best few (the decision stays
# well under 100 us; a worker further down the ranking would not be chosen anyway).
MAX_CANDIDATES = 8
# A learnt overhead halves for every this many seconds without a new observation.
OVERHEAD_HALF_LIFE_S = 60.0


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
class Slo:
    """The targets placement keeps requests inside (seconds)."""

    ttft_s: float
    tpot_s: float


@dataclass(frozen=True, slots=True)
class Prediction:
    """One option's predicted figures (seconds)."""

    decision: Decision
    endpoint: str  # the prefill worker (remote) or the decode worker (local)
    ttft_s: float
    decode_gap_s: float  # the token gap running streams on the decode worker see meanwhile
    overhead_s: float = 0.0  # the learnt part of ttft_s (PrefillOverheads); the rest is compute

    @property
    def compute_s(self) -> float:
        """The model's part of ``ttft_s``: what a measured prefill is compared against."""
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
    p: WorkerView, d: WorkerView, new_tokens: int, overhead_s: float = 0.0
) -> Prediction | None:
    """Remote prefill on ``p`` for a decode leg on ``d``; None without fitted costs."""
    if p.step_base_s is None or p.step_per_prefill_token_s is None:
        return None
    gap = _decode_gap(d)
    if gap is None:
        return None
    work = p.queued_prefill_tokens + new_tokens
    extra = max(overhead_s, 0.0)
    ttft = _steps(work, _chunk(p)) * p.step_base_s + work * p.step_per_prefill_token_s + extra
    return Prediction(Decision.REMOTE, p.endpoint, ttft, gap, extra)


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
          cached: Mapping[str, int], overhead_s: Mapping[str, float]
          ) -> tuple[list[tuple[WorkerView, Prediction | None]], Prediction | None]:
    """The options :func:`decide` compares for a prompt of ``prompt_tokens``: each of the
    first ``MAX_CANDIDATES`` prefill workers with its remote prediction, and the local one
    (None where a side has no fitted costs). A decode worker that never prefilled borrows the
    first prefill worker's cost per token that is known (same model). ``overhead_s``: the
    learnt overheads by endpoint (the prefill workers' and the decode worker's)."""

    def new(endpoint: str) -> int:
        return max(prompt_tokens - cached.get(endpoint, 0), 1)  # the last token always runs

    remote = [(p, predict_remote(p, decode, new(p.endpoint), overhead_s.get(p.endpoint, 0.0)))
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
) -> Placement:
    """Place one prompt of ``prompt_tokens`` whose decode leg is on ``decode``.

    ``prefill``: candidate prefill workers, best first (policy.rank_prefill; the first
    ``MAX_CANDIDATES`` are weighed). ``cached``:
    prompt tokens each endpoint is known to hold already (prefix cache). ``overhead_s``: the
    router's measured extra seconds per endpoint (a prefill worker's remote prefills, the
    decode worker's local ones; :class:`PrefillOverheads`). ``threshold`` > 0: the fixed
    override, prompts shorter than it go local and the rest remote, no model consulted.
    """
    if not prefill:
        return Placement(Decision.LOCAL, Reason.COLOCATED)
    if threshold > 0:
        if prompt_tokens < threshold:
            return Placement(Decision.LOCAL, Reason.THRESHOLD)
        return Placement(Decision.REMOTE, Reason.THRESHOLD, prefill[0].endpoint)
    remote, local = weigh(prompt_tokens, decode, prefill, cached or {}, overhead_s or {})
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


class PrefillOverheads:
    """Per worker that prefilled, what its prefills took beyond the model's prediction at the
    decision, fitted as ``fixed + per_block * blocks`` (``blocks``: the prompt's KV blocks
    the decode worker lacked, what a remote prefill pushes).

    For a prefill worker that is its remote prefills' extra: the Prefill RPC, the KV push and
    the commit, plus wherever its served steps run longer or shorter than its reported fit.
    For a decode worker it is its local prefills' extra over the same kind of prediction. Both
    are learnt, so the comparison in :func:`decide` is between two corrected predictions; with
    only the remote side corrected, the fit's error on a host that slows every served step
    (measured: 1.1-1.3x on this project's 2-core box) counted against remote alone.

    A prefix-delta handoff pushes only the blocks after the decode worker's cached prefix,
    so one flat figure would charge a short delta the cost of a whole-prompt push (or the
    reverse). Each worker's two numbers are exponential moving averages over the prefills
    seen: the mean extra and mean block count, and their covariance over the blocks'
    variance for the slope (a one-variable least-squares fit with forgetting). Until the
    sizes vary the slope stays 0 and the mean stands for every size. Every measured extra
    goes in as it is, a negative one (faster than predicted) too: clipping each at 0 would
    turn the noise of single prefills into a standing penalty. :meth:`current` never
    answers below 0, so a correction only ever adds.

    A figure no prefill has renewed fades: given the time (``now``, seconds on the caller's
    clock), :meth:`current` halves it every ``half_life_s`` since that worker's last
    observation. Otherwise one bad spell could keep an option out for good: an option placed
    nowhere teaches nothing, so its penalty would never come down (at light load the other
    option, chosen every time, costs too little to force a change).
    """

    def __init__(self, weight: float = 0.2, half_life_s: float = OVERHEAD_HALF_LIFE_S) -> None:
        self._weight = weight
        self._half_life_s = half_life_s
        self._fits: dict[str, list[float]] = {}  # endpoint -> [mean x, mean y, var x, cov xy]
        self._seen: dict[str, float] = {}  # endpoint -> the ``now`` of its last observation

    def current(self, pushed_blocks: int = 0, now: float | None = None) -> Mapping[str, float]:
        """Seconds to add to each worker's predicted TTFT for a prompt of which the decode
        worker lacks ``pushed_blocks`` blocks (faded to ``now`` when given)."""
        return {endpoint: self._predict(fit, pushed_blocks) * self.fading(endpoint, now)
                for endpoint, fit in self._fits.items()}

    def fading(self, endpoint: str, now: float | None) -> float:
        """The factor :meth:`current` applies to ``endpoint``'s figure at ``now`` (1 without
        a time on either side)."""
        seen = self._seen.get(endpoint)
        if now is None or seen is None or now <= seen:
            return 1.0
        return 0.5 ** ((now - seen) / self._half_life_s)

    @staticmethod
    def _predict(fit: list[float], blocks: int) -> float:
        mx, my, vx, cxy = fit
        slope = max(cxy / vx, 0.0) if vx > 1e-9 else 0.0
        return max(my + slope * (blocks - mx), 0.0)

    def observe(self, endpoint: str, measured_s: float, predicted_s: float,
                pushed_blocks: int = 0, now: float | None = None) -> None:
        """Fold in one prefill on ``endpoint``: its measured time, the model's compute part
        predicted at the decision (:attr:`Prediction.compute_s`) and its blocks; ``now``: when
        (the clock :meth:`current` is given)."""
        y, x = measured_s - predicted_s, float(pushed_blocks)
        if now is not None:
            self._seen[endpoint] = now
        fit = self._fits.get(endpoint)
        if fit is None:
            self._fits[endpoint] = [x, y, 0.0, 0.0]
            return
        w = self._weight
        mx, my, vx, cxy = fit
        dx, dy = x - mx, y - my
        mx += w * dx
        my += w * dy
        # West's weighted update: (co)variances about the moving means.
        vx = (1 - w) * (vx + w * dx * dx)
        cxy = (1 - w) * (cxy + w * dx * dy)
        self._fits[endpoint] = [mx, my, vx, cxy]

    def forget(self, endpoint: str) -> None:
        """A worker that left the pool (its replacement may sit elsewhere)."""
        self._fits.pop(endpoint, None)
        self._seen.pop(endpoint, None)
