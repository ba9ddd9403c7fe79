"""What the policies see: per-worker samples, cluster snapshots and a sliding window over them.

    scrape (every interval) ──> Snapshot(t, workers) ──> MetricsWindow (last window_s)
    ──> WindowStats: per-role load, latency and token rates, the input of every policy

Latency figures come from the workers' own recent window (a prefill worker's TTFT share is the
time its Prefill calls took; a decode worker's ITL the gap between streamed tokens). Token
totals are cumulative counters: rates come from differences between the oldest and newest
snapshot of the window, per worker, so a worker that joins, leaves or restarts mid-window does
not produce a negative or inflated rate.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass

from autoscaler.roles import RoleName


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

    @property
    def queue_depth(self) -> int:
        """Requests on this worker that are running or waiting."""
        return self.num_running + self.num_waiting


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every worker at one scrape time ``t`` (seconds, any monotonic clock)."""

    t: float
    workers: tuple[WorkerSample, ...]

    def of(self, role: RoleName) -> list[WorkerSample]:
        """The serving (non-draining) workers of ``role``."""
        return [w for w in self.workers if w.role == role and not w.draining]


@dataclass(frozen=True, slots=True)
class WindowStats:
    """Aggregates over the window, the single input of a policy.

    Queue figures are means over the window's snapshots of the pool-wide sum; latency figures
    the worst worker in the newest snapshot that has one (None: no traffic to measure);
    ``kv_usage`` the mean over the window of the pool's mean usage.
    """

    span_s: float = 0.0
    prefill_queue_depth: float = 0.0
    prefill_queue_tokens: float = 0.0
    decode_queue_depth: float = 0.0
    ttft_p90_s: float | None = None
    itl_mean_s: float | None = None
    kv_usage: float = 0.0
    prompt_tokens_per_s: float = 0.0
    output_tokens_per_s: float = 0.0

    def as_dict(self) -> dict[str, float | None]:
        """Plain values for logs and decision records."""
        return asdict(self)


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
        return WindowStats(
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
