"""Counts of every fallback and migration the handoff took (exported as metrics later)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tandem.placement.cost_model import Decision, Placement, Reason


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
