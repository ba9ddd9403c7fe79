"""The ``coupled`` policy: both pools sized together from one model of the workload.

    demand (the router's counters: every prompt token admitted, wherever it is prefilled;
            the tokens streamed, or requests admitted x the mean tokens of the requests
            finished if more, when that is measured on enough admissions or the decode pool
            is saturated: streaming lags admission by half a stream and is capped by the
            decode pool)                     λp prompt tokens/s, λo output tokens/s
      + the prompt demand's trend (counted at admission: one series throughout) over
        trend_s, projected ahead by lead_s (a new worker's start-up), half a window (a
        window's rate is its middle's) and the up cooldown (the next chance to add more):
        a parabola fitted to the trend window, followed while it rises and curves upward
        (a morning ramp accelerates), else its tangent; never below λp, never past 2 λp.
        Only a rise the window's noise cannot explain (a line's rise over the window above
        twice its residuals) is projected; a falling trend is not anticipated. The output
        demand grows alike: λo' = λo λp' / λp
    capacity (the workers' fitted step costs, tandem/autoscaler/capacity.py; priors until fitted)
      prefill  μp = C / (base + per_token C)            at full chunks of C tokens
      decode   B = rows whose step <= share x TPOT target;  μd = B / step(B)
    sizes      P = g_p λp' / (μp u)      D = max(g_d λo' / μd,  KV in use x λo'/λo / KV target)
    feedback   the router's TTFT and TPOT p90 over the window (as a client sees them: queueing,
               reservation and local prefills included) against the targets:
                 over target   the short pool's gain g rises by the miss (at most x1.5 a window,
                               not while that pool's new workers are still starting);
                               TTFT is the decode pool's miss when requests wait for decode
                               room (router queue, KV full), else the prefill pool's
                 well inside   the gain decays back toward 1 (2% a decision)
                 over target   the pool never shrinks while its latency misses

The ratio P:D follows the token mix (both sizes come from the same demand), the total follows
load against the SLO's headroom, and a miss is charged to the pool that causes it. Each call
also leaves a ``forecast`` per pool (the sizes for the demand now and ahead, and the latency
miss): what role flips (tandem/autoscaler/flips.py) weigh against a worker's start-up. The
stabilizer (cooldowns, the down-scale window, step limits) and the controller's safe drains
(tandem/autoscaler/drains.py) apply to these proposals as to every policy's.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping

from tandem.autoscaler.capacity import DecodePrice, PrefillPrice
from tandem.autoscaler.config import AutoscaleConfig
from tandem.autoscaler.decision import Proposal
from tandem.autoscaler.flips import Forecast
from tandem.autoscaler.metrics import WindowStats
from tandem.autoscaler.roles import ROLES, RoleName

GAIN_STEP = 1.5  # the most one window's miss raises a gain
GAIN_DECAY = 0.98  # per decision while latency is well inside its target
OUTPUT_SMOOTHING = 0.2  # weight of a window's tokens-per-request in the running estimate
# Admissions in a window for their rate to stand for demand (its noise ~ 1 / sqrt(n): 10%).
STEADY_ADMISSIONS = 100


class CoupledPolicy:
    """Sizes both pools from demand, fitted capacity and router-side latency (stateful: the
    demand's trend and each pool's feedback gain live here)."""

    def __init__(self, config: AutoscaleConfig) -> None:
        self.config = config
        self.gain: dict[RoleName, float] = {"prefill": 1.0, "decode": 1.0}
        self._raised_t: dict[RoleName, float] = {"prefill": -math.inf, "decode": -math.inf}
        self._demand: deque[tuple[float, float]] = deque()  # (t, λp)
        self._per_request: float | None = None  # output tokens per request, smoothed
        self.forecast: dict[RoleName, Forecast] = {}  # the last call's, per pool

    def __call__(self, stats: WindowStats, current: Mapping[RoleName, int]
                 ) -> dict[RoleName, Proposal]:
        c, tol = self.config.coupled, self.config.tolerance
        # The router's figures (what a client sees); the workers' own without a router.
        ttft = stats.router_ttft_p90_s if stats.router_ttft_p90_s is not None \
            else stats.ttft_p90_s
        tpot = stats.router_tpot_p90_s if stats.router_tpot_p90_s is not None \
            else stats.itl_mean_s
        ttft_r = None if ttft is None else ttft / c.ttft_p90_s
        tpot_r = None if tpot is None else tpot / c.tpot_p90_s
        # Requests waiting for decode room make TTFT the decode pool's miss.
        decode_bound = stats.router_waiting >= 1.0 or stats.kv_usage >= c.kv_usage
        lp, lo = self._now(stats, saturated=decode_bound or (tpot_r or 0.0) > 1.0)
        lp_ahead, lo_ahead = self._ahead(stats.t, lp, lo, stats.span_s > 0)
        miss: dict[RoleName, float | None] = {
            "prefill": None if decode_bound else ttft_r,
            "decode": _worst(tpot_r, ttft_r if decode_bound else None),
        }
        serving: dict[RoleName, int] = {"prefill": stats.prefill_serving,
                                        "decode": stats.decode_serving}
        for role in ROLES:
            self._adapt(role, miss[role], stats.t, starting=current[role] > serving[role])
        if lp <= 0 and lo <= 0 and ttft is None and tpot is None:
            self.forecast = {}
            return {role: Proposal(0, "idle") for role in ROLES}
        proposals = {"prefill": self._prefill(stats, lp_ahead, ttft),
                     "decode": self._decode(stats, lo, lo_ahead, tpot)}
        # The sizes for the demand now (no trend) beside those ahead: when a pool falls short.
        horizon = c.lead_s + self.config.cooldown.up_s
        now = {"prefill": self._prefill(stats, lp, ttft).replicas,
               "decode": self._decode(stats, lo, lo, tpot).replicas}
        self.forecast = {role: Forecast(now[role], max(now[role], proposals[role].replicas),
                                        horizon, miss[role]) for role in ROLES}
        out: dict[RoleName, Proposal] = {}
        for role in ROLES:
            p, now = proposals[role], current[role]
            # Hysteresis inside the policy: a pool short of its latency target never shrinks,
            # and small moves are not worth a change (half the band for growing, the whole
            # band for shrinking: an SLO miss costs more than an idle worker).
            band = tol * now / 2 if p.replicas > now else tol * now
            if p.replicas < now and (miss[role] or 0.0) > 1.0:
                p = Proposal(now, f"hold: {p.signal} (latency over target)", p.value, p.target)
            elif p.replicas != now and abs(p.replicas - now) <= band:
                p = Proposal(now, f"hold: {p.signal} (within tolerance)", p.value, p.target)
            out[role] = p
        return out

    # -- demand --------------------------------------------------------------------------------
    def _now(self, stats: WindowStats, saturated: bool) -> tuple[float, float]:
        """Prompt and output tokens/s asked for now: the router's counters, else the workers'
        (which miss the prompts the decode workers prefilled themselves). Output: what was
        streamed, or what was admitted if more (on enough admissions, or ``saturated``).
        (A few admissions in a window shorter than a stream are bursty: not used then.)"""
        lp = stats.router_prompt_tokens_per_s
        lo = stats.router_output_tokens_per_s
        lp = stats.prompt_tokens_per_s if lp is None else lp
        lo = stats.output_tokens_per_s if lo is None else lo
        per_request = stats.router_output_per_request
        if per_request is not None:
            self._per_request = per_request if self._per_request is None else (
                OUTPUT_SMOOTHING * per_request + (1 - OUTPUT_SMOOTHING) * self._per_request)
        admitted = stats.router_requests_per_s
        if admitted is not None and self._per_request is not None and (
                saturated or admitted * stats.span_s >= STEADY_ADMISSIONS):
            lo = max(lo, admitted * self._per_request)
        return lp, lo

    def _ahead(self, t: float, lp: float, lo: float, measured: bool) -> tuple[float, float]:
        """The demand when workers asked for now serve (see the module docstring): a rising
        trend projected, a falling one not (the down-scale window and drains lag behind it
        anyway)."""
        c = self.config.coupled
        half = self.config.window_s / 2
        history = self._demand
        if not measured:  # a window of one snapshot has no rate yet: not a point of the trend
            return lp, lo
        history.append((t - half, lp))  # a window's rate is its middle's
        while history and history[-1][0] - history[0][0] > c.trend_s:
            history.popleft()
        if len(history) < 4 or history[-1][0] - history[0][0] < c.trend_s / 4 or lp <= 0:
            return lp, lo
        if not _rising(history):
            return lp, lo
        ahead = c.lead_s + half + self.config.cooldown.up_s  # from the newest point
        value, slope, curve = _parabola(history)
        if slope <= 0:  # the rise is over (a parabola past its top, or a step's shoulder)
            return lp, lo
        tangent = value + slope * ahead
        bent = tangent + max(0.0, curve) * ahead * ahead
        lp_ahead = min(max(lp, bent), 2 * lp)
        return lp_ahead, lo * lp_ahead / lp

    # -- feedback ------------------------------------------------------------------------------
    def _adapt(self, role: RoleName, miss: float | None, t: float, starting: bool) -> None:
        """Raise ``role``'s gain by a latency miss (once a window, never while workers it
        asked for are still starting); let it decay while latency is well inside."""
        if miss is None:
            return
        tol = self.config.tolerance
        gain = self.gain[role]
        if miss > 1.0 + tol:
            if not starting and t - self._raised_t[role] >= self.config.window_s:
                gain = min(self.config.coupled.max_gain, gain * min(miss, GAIN_STEP))
                self._raised_t[role] = t
        elif miss < 1.0 - 2 * tol:
            gain = max(1.0, gain * GAIN_DECAY)
        self.gain[role] = gain

    # -- sizes ---------------------------------------------------------------------------------
    def _prefill(self, stats: WindowStats, lp_ahead: float, ttft: float | None) -> Proposal:
        c = self.config.coupled
        price = prefill_price(stats, self.config)
        if price is None:
            return _latency_only(stats.prefill_serving, ttft, c.ttft_p90_s, "ttft_p90_s")
        per_worker = price.tokens_per_s() * c.prefill_utilization / self.gain["prefill"]
        return Proposal(_ceil(lp_ahead / per_worker), "prompt_tokens_per_s", lp_ahead,
                        per_worker)

    def _decode(self, stats: WindowStats, lo: float, lo_ahead: float, tpot: float | None
                ) -> Proposal:
        c = self.config.coupled
        growth = lo_ahead / lo if lo > 0 else 1.0
        kv_need = stats.kv_usage * stats.decode_serving * growth / c.kv_usage
        kv = Proposal(_ceil(kv_need), "kv_usage", stats.kv_usage, c.kv_usage)
        price = decode_price(stats, self.config)
        if price is None:
            by_latency = _latency_only(stats.decode_serving, tpot, c.tpot_p90_s, "tpot_p90_s")
            return kv if kv.replicas > by_latency.replicas else by_latency
        rows = price.rows_within(c.decode_step_share * c.tpot_p90_s, c.max_rows)
        per_worker = price.tokens_per_s(rows) / self.gain["decode"]
        tokens = Proposal(_ceil(lo_ahead / per_worker), "output_tokens_per_s", lo_ahead,
                          per_worker)
        return kv if kv.replicas > tokens.replicas else tokens


def prefill_price(stats: WindowStats, config: AutoscaleConfig) -> PrefillPrice | None:
    """The prefill pool's fitted step cost, else the configured prior, else None."""
    c = config.coupled
    token_s = stats.prefill_step_token_s or c.prefill_token_s
    if token_s <= 0:
        return None
    base_s = stats.prefill_step_base_s if stats.prefill_step_token_s else c.prefill_base_s
    chunk = stats.prefill_chunk_tokens or c.prefill_chunk_tokens
    return PrefillPrice(base_s or 0.0, token_s, chunk)


def decode_price(stats: WindowStats, config: AutoscaleConfig) -> DecodePrice | None:
    """The decode pool's fitted step cost, else the configured prior, else None."""
    c = config.coupled
    if stats.decode_step_base_s is not None and stats.decode_step_row_s is not None:
        return DecodePrice(stats.decode_step_base_s, stats.decode_step_row_s)
    if c.decode_base_s > 0 or c.decode_row_s > 0:
        return DecodePrice(c.decode_base_s, c.decode_row_s)
    return None


def _latency_only(serving: int, observed: float | None, target: float, signal: str
                  ) -> Proposal:
    """Without a capacity model: grow by a miss, otherwise keep what serves."""
    if observed is None or observed <= target:
        return Proposal(serving, signal, observed or 0.0, target)
    return Proposal(_ceil(max(serving, 1) * min(observed / target, GAIN_STEP)), signal,
                    observed, target)


def _rising(points: deque[tuple[float, float]]) -> bool:
    """Whether a least-squares line rises over the points by more than twice the scatter of
    the points about it (noise alone rarely does)."""
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var <= 0:
        return False
    slope = sum((t - mean_t) * (v - mean_v) for t, v in points) / var
    scatter = math.sqrt(sum((v - mean_v - slope * (t - mean_t)) ** 2 for t, v in points) / n)
    return slope > 0 and slope * (points[-1][0] - points[0][0]) > 2 * scatter


def _parabola(points: deque[tuple[float, float]]) -> tuple[float, float, float]:
    """Least-squares ``v = a + b x + c x^2`` with ``x`` the time since the newest point:
    (a, b, c) = the fitted value, slope and half the second derivative there."""
    newest = points[-1][0]
    xs = [t - newest for t, _ in points]
    moments = [sum(x ** k for x in xs) for k in range(5)]
    normal = [[moments[i + j] for j in range(3)] for i in range(3)]
    rhs = [sum(v * x ** i for x, (_, v) in zip(xs, points, strict=True)) for i in range(3)]
    det = _det3(normal)
    if abs(det) < 1e-12 * max(1.0, abs(normal[2][2]) ** 3):
        return points[-1][1], 0.0, 0.0
    coefs = []
    for k in range(3):  # Cramer's rule
        m = [[rhs[i] if j == k else normal[i][j] for j in range(3)] for i in range(3)]
        coefs.append(_det3(m) / det)
    return coefs[0], coefs[1], coefs[2]


def _det3(m: list[list[float]]) -> float:
    return (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
            - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))


def _worst(*ratios: float | None) -> float | None:
    known = [r for r in ratios if r is not None]
    return max(known) if known else None


def _ceil(x: float) -> int:
    return max(0, math.ceil(x - 1e-9))
