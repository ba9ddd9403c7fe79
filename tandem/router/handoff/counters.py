"""Counts of every fallback and migration the handoff took (exported as metrics later), and
the live moves' figures (by cause and outcome, KV bytes moved, the stream's gap)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tandem.placement.cost_model import Decision, Placement, Reason
from tandem.placement.slo import ITL_BUCKETS

GAP_STEP_BUCKETS = (0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 10.0, 20.0, 50.0, 100.0)


@dataclass(slots=True)
class Histogram:
    """Counts of observations per upper bound (cumulative at export), and their sum."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound

    def observe(self, value: float) -> None:
        """One observation."""
        i = next((i for i, b in enumerate(self.bounds) if value <= b), len(self.bounds))
        self.counts[i] += 1
        self.total += value


@dataclass(slots=True)
class HandoffCounters:
    """Monotonic counters, one per kind of detour a request can take."""

    requests: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    prefill_retries: int = 0  # a prefill worker failed; another one was tried
    local_prefill_fallbacks: int = 0  # every prefill worker failed; the decode worker prefilled
    local_prefill_short: int = 0  # prompt under the threshold: prefilled on the decode worker
    local_prefill_colocated: int = 0  # no prefill worker in the pool
    local_prefill_placed: int = 0  # placement's cost model chose the decode worker
    reserve_retries: int = 0  # a decode worker refused or failed Reserve; another one was tried
    migrations: int = 0  # a decode worker died mid-stream; the request moved to another
    aborts_sent: int = 0
    # (decision, reason) of every placement (tandem/placement/cost_model.py)
    decisions: Counter[tuple[str, str]] = field(default_factory=Counter)
    # live moves (tandem/router/handoff/live_moves.py): (cause, "moved" | "stayed")
    live_moves: Counter[tuple[str, str]] = field(default_factory=Counter)
    moved_bytes: int = 0  # KV pushed by live moves once their streams stopped
    precopy_bytes: int = 0  # KV pushed by live moves' pre-copies, the streams decoding on
    # the client-visible gap of each live move: last token from the old worker to the first
    # from the new one (ITL's buckets: it is an inter-token latency)
    move_gap: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    # that gap over the source's recent decode step (tandem/router/handoff/move_gap.py)
    move_gap_steps: Histogram = field(default_factory=lambda: Histogram(GAP_STEP_BUCKETS))

    def count_placement(self, placed: Placement) -> None:
        """One placement decision: its (decision, reason), and for a local one why."""
        self.decisions[(placed.decision.value, placed.reason.value)] += 1
        if placed.decision is not Decision.LOCAL:
            return
        if placed.reason is Reason.COLOCATED:
            self.local_prefill_colocated += 1
        elif placed.reason is Reason.THRESHOLD:
            self.local_prefill_short += 1
        else:
            self.local_prefill_placed += 1

