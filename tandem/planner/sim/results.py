"""What a simulation produced: one outcome per request, and the summary the field reports.

Latency is reported as benchmarks do (docs/design.md section 7): TTFT, TPOT, E2E at p50/p90/p99,
goodput (requests per second meeting both the TTFT and the TPOT target) and SLO attainment
(the share of requests meeting both). Percentiles are nearest-rank: the smallest value with
at least p% of the values at or below it, so every reported figure is one a request had.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tandem.placement.slo import Slo


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank ``p``-th percentile (0 < p <= 100) of ``values`` (NaN when empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(slots=True)
class RequestOutcome:
    """One trace request, in trace order. Times are seconds; NaN where it never got there.

    ``tpot_s`` = (finish - first token) / (output_tokens - 1), 0 for one-token requests;
    ``itl_max_s`` the longest gap between two of its tokens while it ran on a decode worker
    (the gap across a migration is not counted). ``prefill_endpoint`` is the last prefill
    worker it was sent to ("" when prefilled locally), ``decode_endpoint`` the last decode
    worker that reserved it.
    """

    index: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    tpot_s: float
    itl_max_s: float
    e2e_s: float
    decision: str
    reason: str
    prefill_endpoint: str
    decode_endpoint: str
    pushed_bytes: int
    migrations: int
    completed: bool
    failed: str = ""  # why it did not complete: "too_long", "migrations", "" (stranded)

    @property
    def migrated(self) -> bool:
        """Whether its decode leg moved to another worker at least once."""
        return self.migrations > 0

    def meets(self, slo: Slo) -> bool:
        """Completed within both targets."""
        return self.completed and self.ttft_s <= slo.ttft_s and self.tpot_s <= slo.tpot_s


@dataclass(frozen=True, slots=True)
class Summary:
    """A run's figures over the requests arriving at or after ``warmup_s``.

    Rates divide by the window from the first such arrival to the last such finish.
    """

    requests: int
    completed: int
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    tpot_p99_s: float
    e2e_p50_s: float
    e2e_p90_s: float
    e2e_p99_s: float
    itl_max_p99_s: float
    output_tokens_per_s: float
    requests_per_s: float
    slo_attainment: float
    goodput_rps: float
    decisions: dict[str, int]
    migrations: int
    pushed_bytes: int
    wall_s: float
    simulated_s: float


@dataclass(slots=True)
class SimResult:
    """Everything one :func:`tandem.planner.sim.simulate` run produced."""

    outcomes: list[RequestOutcome]
    decisions: dict[tuple[str, str], int]  # (decision, reason): tandem_disagg_decision_total
    leaked_blocks: int  # blocks reserved or pinned at the end, or unaccounted for (0)
    wall_s: float  # seconds the simulation took on this machine
    simulated_s: float  # the simulated clock when the last event was handled
    events: int = 0
    migrations: int = 0
    prefill_retries: int = 0
    local_fallbacks: int = 0
    prefill_timeouts: int = 0  # remote prefills past the transfer timeout (retried)
    stranded: int = 0  # requests still waiting at the router when nothing was left to run
    live_migrations: int = 0  # streams moved with their KV (role flips), and the bytes
    migrated_bytes: int = 0
    # Shares of the simulated time the pools spent stepping (busy seconds over workers ever
    # started x simulated seconds) and the decode batch's mean rows while stepping.
    prefill_busy: float = 0.0
    decode_busy: float = 0.0
    decode_mean_rows: float = 0.0
    decode_mean_step_s: float = 0.0  # seconds stepping over steps run, all decode workers
    decode_rows_per_step: float = 0.0  # rows over steps run (not weighted by step length)

    def summary(self, slo: Slo, warmup_s: float = 0.0) -> Summary:
        """TTFT/TPOT/E2E percentiles, throughput, SLO attainment and goodput."""
        measured = [o for o in self.outcomes if o.arrival_s >= warmup_s]
        done = [o for o in measured if o.completed]
        multi = [o.tpot_s for o in done if o.output_tokens > 1]
        window = 0.0
        if done:
            start = min(o.arrival_s for o in measured)
            window = max(o.arrival_s + o.e2e_s for o in done) - start
        rate = (lambda n: n / window) if window > 0 else (lambda n: 0.0)
        good = sum(1 for o in done if o.meets(slo))
        decisions: dict[str, int] = {}
        for o in measured:
            if o.decision:
                name = f"{o.decision}/{o.reason}"
                decisions[name] = decisions.get(name, 0) + 1
        ttft = [o.ttft_s for o in done]
        e2e = [o.e2e_s for o in done]
        itl = [o.itl_max_s for o in done]
        return Summary(
            requests=len(measured), completed=len(done),
            ttft_p50_s=percentile(ttft, 50), ttft_p90_s=percentile(ttft, 90),
            ttft_p99_s=percentile(ttft, 99),
            tpot_p50_s=percentile(multi, 50), tpot_p90_s=percentile(multi, 90),
            tpot_p99_s=percentile(multi, 99),
            e2e_p50_s=percentile(e2e, 50), e2e_p90_s=percentile(e2e, 90),
            e2e_p99_s=percentile(e2e, 99), itl_max_p99_s=percentile(itl, 99),
            output_tokens_per_s=rate(sum(o.output_tokens for o in done)),
            requests_per_s=rate(len(done)),
            slo_attainment=good / len(measured) if measured else 0.0,
            goodput_rps=rate(good), decisions=decisions,
            migrations=sum(o.migrations for o in measured),
            pushed_bytes=sum(o.pushed_bytes for o in measured),
            wall_s=self.wall_s, simulated_s=self.simulated_s)
