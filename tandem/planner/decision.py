"""What the plan tells the user to deploy: one decision that every output reads.

The verdict paragraph, the table's marker, ``plan.json``'s ``chosen``, the printed ``tandem
up`` line and ``values.yaml`` are all derived from one :class:`Decision`, so they cannot name
different configurations. The rule: fewer GPUs wins; on a tie, more goodput (headroom above
the planned rate) wins, and an exact tie keeps colocation (one pool is simpler to run).
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.planner.search import Candidate, Plan


@dataclass(frozen=True, slots=True)
class Decision:
    """The configuration to deploy (None: nothing the search tried meets the SLO), the
    feasible alternative it beat (None when there was none), and why, in one paragraph."""

    chosen: Candidate | None
    runner_up: Candidate | None
    reason: str

    @property
    def colocated(self) -> bool:
        """Whether the chosen configuration is a colocated pool (no prefill workers)."""
        return self.chosen is not None and self.chosen.kind == "colocated"


def _goodput(c: Candidate) -> float:
    return c.goodput_rps or 0.0


def decide(plan: Plan) -> Decision:
    """Pick between the cheapest feasible split and the cheapest feasible colocated pool."""
    split, colo = plan.disaggregated, plan.colocated
    if split is None and colo is None:
        return Decision(None, None, "No configuration the search tried meets the SLO at this "
                        "rate: relax the targets, lower the rate, or give it a faster profile.")
    if split is None:
        assert colo is not None
        return Decision(colo, None, f"Colocated wins: {colo.decode} workers ({colo.gpus} GPUs) "
                        "meet the SLO; no disaggregated split the search tried does.")
    name = f"P={split.prefill} + D={split.decode}"
    if colo is None:
        return Decision(split, None, f"Disaggregated wins: {name} ({split.gpus} GPUs) meet "
                        "the SLO; no colocated pool the search tried does.")
    if split.gpus == colo.gpus:
        disaggregate = _goodput(split) > _goodput(colo)
        head = (f"A tie on GPUs: {name} and {colo.decode} colocated workers both need "
                f"{split.gpus}. Headroom decides: goodput {_goodput(split):.3g} vs "
                f"{_goodput(colo):.3g} req/s, so ")
        if disaggregate:
            return Decision(split, colo, head + "disaggregate.")
        return Decision(colo, split, head + "colocate.")
    if colo.gpus < split.gpus:
        return Decision(colo, split, f"Colocated wins: {colo.decode} workers ({colo.gpus} "
                        f"GPUs) meet the SLO, where the cheapest disaggregated split needs "
                        f"{split.gpus} GPUs ({name}).")
    return Decision(split, colo, f"Disaggregated wins: {name} ({split.gpus} GPUs), "
                    f"{1 - split.gpus / colo.gpus:.0%} fewer GPUs than colocated "
                    f"({colo.decode} workers, {colo.gpus} GPUs).")
