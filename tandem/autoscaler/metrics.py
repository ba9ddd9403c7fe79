"""What the policies see: per-worker samples, cluster snapshots and a sliding window over them.

    scrape (every interval) ──> Snapshot(t, workers, router) ──> MetricsWindow (last window_s)
    ──> WindowStats: per-role load, latency and token rates, the input of every policy

Two kinds of latency figure:

- the workers' own recent window (a prefill worker's TTFT share is the time its Prefill calls
  took; a decode worker's ITL the gap between streamed tokens): ``ttft_p90_s``,
  ``itl_mean_s``, what the ``slo`` policy reads;
- the router's, as a client sees them (``RouterSample``: its cumulative TTFT and per-request
  TPOT histograms, which include the admission queue, the reservation and local prefills):
  ``router_ttft_p90_s``, ``router_tpot_p90_s`` over the window, from the difference of the
  window's oldest and newest readings (tandem/common/obs/histogram.py). The ``coupled`` policy reads
  these, and the router's own prompt and output token counters for the demand.

Token totals are cumulative counters: rates come from differences between the oldest and newest
snapshot of the window, per worker, so a worker that joins, leaves or restarts mid-window does
not produce a negative or inflated rate. Each worker also reports its fitted step costs
(tandem/common/step_costs.py, through the Stats RPC): the window gives the pool's median of the
newest snapshot that has them, the per-token and per-row prices a capacity model needs.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, fields

from tandem.autoscaler.roles import RoleName
from tandem.common.obs.histogram import Buckets, histogram_delta, histogram_quantile


@dataclass(frozen=True, slots=True)
class WorkerSample:
    """One worker at one scrape: its Stats RPC figures plus its recent latency window."""

    role: RoleName
    worker_id: str
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    draining: bool = False
    queued_prompt_tokens: int = 0  # prefill: prompt tokens of the prefills in progress
    ttft_p90_s: float | None = None  # prefill: p90 of its Prefill call times, recent window
    itl_mean_s: float | None = None  # decode: mean gap between streamed tokens, recent window
    prompt_tokens_total: int = 0  # cumulative prompt tokens prefilled
    output_tokens_total: int = 0  # cumulative tokens streamed
    leased_blocks: int = 0  # prefill: destination KV blocks of its Prefill calls in progress
    # The worker's fitted step cost (seconds; None: not observed yet):
    # base + per_row * decode rows + per_prefill_token * prompt tokens
    step_base_s: float | None = None
    step_per_row_s: float | None = None
    step_per_prefill_token_s: float | None = None
    max_batched_tokens: int = 0  # tokens one step may take (the prefill chunk budget)

    @property
    def queue_depth(self) -> int:
        """Requests on this worker that are running or waiting."""
        return self.num_running + self.num_waiting


@dataclass(frozen=True, slots=True)
class RouterSample:
    """The router's cumulative figures at one scrape (tandem/router/metrics.py's names)."""

    ttft: Buckets = ()  # tandem_time_to_first_token_seconds: arrival to first token
    tpot: Buckets = ()  # tandem_time_per_output_token_seconds: per finished request
    prompt_tokens_total: float = 0.0  # tandem_prompt_tokens_total (admitted requests)
    output_tokens_total: float = 0.0  # tandem_generation_tokens_total (streamed)
    admitted_total: float = 0.0  # tandem_request_queue_time_seconds_count (admissions)
    finished_total: float = 0.0  # tandem_request_generation_tokens_count (finished requests)
    finished_tokens_total: float = 0.0  # ..._sum: the tokens those requests streamed
    waiting: float = 0.0  # tandem_num_requests_waiting (admission queue)
    running: float = 0.0  # tandem_num_requests_running


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every worker (and the router, when scraped) at one time ``t`` (seconds, any
    monotonic clock)."""

    t: float
    workers: tuple[WorkerSample, ...]
    router: RouterSample | None = None

    def of(self, role: RoleName) -> list[WorkerSample]:
        """The serving (non-draining) workers of ``role``."""
        return [w for w in self.workers if w.role == role and not w.draining]


@dataclass(frozen=True, slots=True)
class WindowStats:
    """Aggregates over the window, the single input of a policy.

    Queue figures are means over the window's snapshots of the pool-wide sum; latency figures
    the worst worker in the newest snapshot that has one (None: no traffic to measure);
    ``kv_usage`` the mean over the window of the pool's mean usage. ``router_*`` figures are
    None without two router readings in the window (or, for latency, no request in it); step
    costs are the pool's median (None: no worker has fitted that part yet).
    """

    t: float = 0.0  # the newest snapshot's time
    span_s: float = 0.0
    prefill_queue_depth: float = 0.0
    prefill_queue_tokens: float = 0.0
    decode_queue_depth: float = 0.0
    ttft_p90_s: float | None = None
    itl_mean_s: float | None = None
    kv_usage: float = 0.0
    prompt_tokens_per_s: float = 0.0
    output_tokens_per_s: float = 0.0
    prefill_serving: int = 0  # serving (non-draining) workers in the newest snapshot
    decode_serving: int = 0
    router_ttft_p90_s: float | None = None
    router_tpot_p90_s: float | None = None
    router_prompt_tokens_per_s: float | None = None
    router_output_tokens_per_s: float | None = None
    router_requests_per_s: float | None = None  # admitted
    router_output_per_request: float | None = None  # mean tokens of the requests finished
    router_waiting: float = 0.0
    prefill_step_base_s: float | None = None
    prefill_step_token_s: float | None = None
    prefill_chunk_tokens: int = 0
    decode_step_base_s: float | None = None
    decode_step_row_s: float | None = None

    def as_dict(self) -> dict[str, float | None]:
        """Plain values for logs and decision records."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


class MetricsWindow:
    """The snapshots of the last ``window_s`` seconds."""

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        self.window_s = window_s
        self._snaps: deque[Snapshot] = deque()

    def add(self, snap: Snapshot) -> None:
        """Append a scrape and forget those older than the window."""
        if self._snaps and snap.t < self._snaps[-1].t:
            raise ValueError("snapshots must arrive in time order")
        self._snaps.append(snap)
        while self._snaps and snap.t - self._snaps[0].t > self.window_s:
            self._snaps.popleft()

    def __len__(self) -> int:
        return len(self._snaps)

    def stats(self) -> WindowStats:
        """Aggregate the window (all zeros / None when empty)."""
        snaps = list(self._snaps)
        if not snaps:
            return WindowStats()
        n = len(snaps)
        prompt_rate, output_rate = _rates(snaps)
        newest = snaps[-1]
        routed = [s.router for s in snaps if s.router is not None]
        routed_t = [s.t for s in snaps if s.router is not None]
        first, last = (routed[0], routed[-1]) if len(routed) >= 2 else (None, None)
        router_span = routed_t[-1] - routed_t[0] if len(routed) >= 2 else 0.0
        return WindowStats(
            t=newest.t,
            span_s=snaps[-1].t - snaps[0].t,
            prefill_queue_depth=sum(_sum(s, "prefill", "queue_depth") for s in snaps) / n,
            prefill_queue_tokens=sum(
                _sum(s, "prefill", "queued_prompt_tokens") for s in snaps
            ) / n,
            decode_queue_depth=sum(_sum(s, "decode", "queue_depth") for s in snaps) / n,
            ttft_p90_s=_latest_worst(snaps, "prefill", "ttft_p90_s"),
            itl_mean_s=_latest_worst(snaps, "decode", "itl_mean_s"),
            kv_usage=sum(_mean_usage(s) for s in snaps) / n,
            prompt_tokens_per_s=prompt_rate,
            output_tokens_per_s=output_rate,
            prefill_serving=len(newest.of("prefill")),
            decode_serving=len(newest.of("decode")),
            router_ttft_p90_s=_window_p90(first, last, "ttft"),
            router_tpot_p90_s=_window_p90(first, last, "tpot"),
            router_prompt_tokens_per_s=_counter_rate(first, last, router_span,
                                                     "prompt_tokens_total"),
            router_output_tokens_per_s=_counter_rate(first, last, router_span,
                                                     "output_tokens_total"),
            router_requests_per_s=_counter_rate(first, last, router_span, "admitted_total"),
            router_output_per_request=_per_finished(first, last),
            router_waiting=sum(r.waiting for r in routed) / len(routed) if routed else 0.0,
            prefill_step_base_s=_median_cost(snaps, "prefill", "step_base_s"),
            prefill_step_token_s=_median_cost(snaps, "prefill", "step_per_prefill_token_s"),
            prefill_chunk_tokens=int(_median_cost(snaps, "prefill", "max_batched_tokens") or 0),
            decode_step_base_s=_median_cost(snaps, "decode", "step_base_s"),
            decode_step_row_s=_median_cost(snaps, "decode", "step_per_row_s"),
        )


def _sum(snap: Snapshot, role: RoleName, field: str) -> float:
    return float(sum(getattr(w, field) for w in snap.of(role)))


def _mean_usage(snap: Snapshot) -> float:
    pool = snap.of("decode")
    return sum(w.kv_cache_usage for w in pool) / len(pool) if pool else 0.0


def _latest_worst(snaps: list[Snapshot], role: RoleName, field: str) -> float | None:
    """The largest value any worker of ``role`` reports in the newest snapshot having one."""
    for snap in reversed(snaps):
        values = [getattr(w, field) for w in snap.of(role) if getattr(w, field) is not None]
        if values:
            return float(max(values))
    return None


def _rates(snaps: list[Snapshot]) -> tuple[float, float]:
    """Prompt and output tokens per second over the window, summed over workers present at
    both ends (draining ones included: their work counts)."""
    first, last = snaps[0], snaps[-1]
    span = last.t - first.t
    if span <= 0:
        return 0.0, 0.0
    before = {w.worker_id: w for w in first.workers}
    prompt = output = 0
    for w in last.workers:
        old = before.get(w.worker_id)
        if old is None:
            continue
        prompt += max(0, w.prompt_tokens_total - old.prompt_tokens_total)
        output += max(0, w.output_tokens_total - old.output_tokens_total)
    return prompt / span, output / span


def _window_p90(first: RouterSample | None, last: RouterSample | None, name: str
                ) -> float | None:
    """The p90 of the router histogram ``name`` over the observations between two readings."""
    if first is None or last is None:
        return None
    new: Buckets = getattr(last, name)
    if not new:
        return None
    value = histogram_quantile(histogram_delta(getattr(first, name), new), 0.9)
    return None if math.isnan(value) else value


def _counter_rate(first: RouterSample | None, last: RouterSample | None, span: float,
                  name: str) -> float | None:
    """Per-second increase of a router counter between two readings (a reset counts from 0)."""
    if first is None or last is None or span <= 0:
        return None
    before, after = getattr(first, name), getattr(last, name)
    return (after - before if after >= before else after) / span


def _per_finished(first: RouterSample | None, last: RouterSample | None) -> float | None:
    """Mean tokens of the requests finished between two readings (None: none finished)."""
    if first is None or last is None or last.finished_total <= first.finished_total:
        return None
    tokens = last.finished_tokens_total - first.finished_tokens_total
    return max(0.0, tokens) / (last.finished_total - first.finished_total)


def _median_cost(snaps: list[Snapshot], role: RoleName, field: str) -> float | None:
    """The median of ``field`` over ``role``'s workers in the newest snapshot where any
    reports it (a positive value: 0 and None mean unknown)."""
    for snap in reversed(snaps):
        values = [v for w in snap.of(role) if (v := getattr(w, field)) is not None and v > 0]
        if values:
            return float(statistics.median(values))
    return None
