"""Latency statistics of a serving run, reported the way the field reports them.

    TTFT  send -> first token                     (prefill + queueing + handoff)
    ITL   gap between consecutive tokens           (every gap of every request)
    TPOT  (E2E - TTFT) / (output tokens - 1)       (one number per request)
    E2E   send -> last token
    goodput  requests/s that met both the TTFT and the TPOT target
    SLO attainment  the share of sent requests that met both (tandem/loadgen/sweep.py)
"""

from __future__ import annotations

from dataclasses import dataclass, field

PERCENTILES = (50, 90, 99)


@dataclass(slots=True)
class RequestResult:
    """What one request saw; times in seconds, relative to its own send time."""

    index: int
    kind: str
    ok: bool
    error: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    sent_at: float = 0.0  # seconds after the run started
    ttft: float = 0.0
    e2e: float = 0.0
    token_times: list[float] = field(default_factory=list)  # arrival of each token
    conversation: int = -1  # multi-turn workloads: which conversation (-1: none)
    turn: int = 0  # and which turn of it (0: the first)

    @property
    def itls(self) -> list[float]:
        """Gaps between consecutive tokens (tokens arriving in one message count as 0 gaps)."""
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first; None for single-token outputs."""
        if self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (like numpy's default); NaN for no values."""
    if not values:
        return float("nan")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _dist(values: list[float]) -> dict[str, float]:
    out = {f"p{q}": percentile(values, q) for q in PERCENTILES}
    out["mean"] = sum(values) / len(values) if values else float("nan")
    return out


def meets_slo(r: RequestResult, slo_ttft_s: float, slo_tpot_s: float) -> bool:
    """Finished, TTFT within target and TPOT within target (single-token outputs: no TPOT)."""
    tpot = r.tpot
    return r.ok and r.ttft <= slo_ttft_s and (tpot is None or tpot <= slo_tpot_s)


def attainment(results: list[RequestResult], slo_ttft_s: float, slo_tpot_s: float) -> float:
    """Share of ``results`` meeting both targets; failed requests count as misses."""
    if not results:
        return 0.0
    return sum(meets_slo(r, slo_ttft_s, slo_tpot_s) for r in results) / len(results)


def by_turn(results: list[RequestResult]) -> dict[int, dict[str, float]]:
    """Per turn index of a multi-turn run: how much of each prompt the prefix cache served.

    ``cached_share`` = mean cached tokens / mean prompt tokens over the finished requests.
    """
    out: dict[int, dict[str, float]] = {}
    done = [r for r in results if r.ok and r.conversation >= 0]
    for turn in sorted({r.turn for r in done}):
        mine = [r for r in done if r.turn == turn]
        prompt = sum(r.prompt_tokens for r in mine) / len(mine)
        cached = sum(r.cached_tokens for r in mine) / len(mine)
        out[turn] = {
            "n": len(mine),
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "cached_share": cached / prompt if prompt else 0.0,
            "ttft_p50": percentile([r.ttft for r in mine], 50),
        }
    return out


def summarize(
    results: list[RequestResult],
    duration_s: float,
    *,
    slo_ttft_s: float,
    slo_tpot_s: float,
) -> dict[str, object]:
    """Percentiles (seconds), throughput and goodput of one run; JSON-ready."""
    ok = [r for r in results if r.ok]
    tpots = [t for r in ok if (t := r.tpot) is not None]
    good = [r for r in ok if meets_slo(r, slo_ttft_s, slo_tpot_s)]
    by_kind: dict[str, dict[str, object]] = {}
    for kind in sorted({r.kind for r in results}):
        mine = [r for r in ok if r.kind == kind]
        by_kind[kind] = {
            "n": len(mine),
            "ttft": _dist([r.ttft for r in mine]),
            "tpot": _dist([t for r in mine if (t := r.tpot) is not None]),
        }
    out_tokens = sum(r.output_tokens for r in ok)
    summary: dict[str, object] = {
        "requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration_s,
        "ttft": _dist([r.ttft for r in ok]),
        "tpot": _dist(tpots),
        "itl": _dist([gap for r in ok for gap in r.itls]),
        "e2e": _dist([r.e2e for r in ok]),
        "throughput_rps": len(ok) / duration_s if duration_s > 0 else 0.0,
        "output_tok_s": out_tokens / duration_s if duration_s > 0 else 0.0,
        "goodput_rps": len(good) / duration_s if duration_s > 0 else 0.0,
        "goodput_share": len(good) / len(results) if results else 0.0,
        "slo": {"ttft_s": slo_ttft_s, "tpot_s": slo_tpot_s},
        "by_kind": by_kind,
    }
    if any(r.conversation >= 0 for r in results):
        summary["by_turn"] = by_turn(results)
    return summary


# A worker's cumulative counters on its /metrics that say how busy it was (names as scraped).
WORKER_COUNTERS = {"steps": "tandem_engine_steps_total",
                   "step_s": "tandem_engine_step_seconds_sum",
                   "tokens": "tandem_generation_tokens_total"}


def worker_counters(metrics_text: str) -> dict[str, float]:
    """``WORKER_COUNTERS`` read off a worker's /metrics text (summed over label sets)."""
    from prometheus_client.parser import text_string_to_metric_families

    names = {v: k for k, v in WORKER_COUNTERS.items()}
    out = dict.fromkeys(WORKER_COUNTERS, 0.0)
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name in names:
                out[names[sample.name]] += sample.value
    return out


def decision_counts(metrics_text: str) -> dict[str, float]:
    """``decision/reason`` -> count, from a router's /metrics text
    (``tandem_disagg_decision_total``)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {f"{s.labels['decision']}/{s.labels['reason']}": s.value
            for family in text_string_to_metric_families(metrics_text) for s in family.samples
            if s.name == "tandem_disagg_decision_total"}


def worker_activity(before: dict[str, float], after: dict[str, float],
                    duration_s: float) -> dict[str, float]:
    """What one worker did between two reads of its ``WORKER_COUNTERS``: steps, seconds
    stepping, tokens sampled; the share of ``duration_s`` it stepped (``busy``), its mean
    step, and its tokens per step (a decode worker's mean batch: each row samples one token
    a step)."""
    d = {k: after[k] - before.get(k, 0.0) for k in WORKER_COUNTERS}
    steps = d["steps"]
    return {**d, "busy": d["step_s"] / duration_s if duration_s > 0 else 0.0,
            "mean_step_s": d["step_s"] / steps if steps else 0.0,
            "tokens_per_step": d["tokens"] / steps if steps else 0.0}
