"""What each engine step cost, fed to the step-cost fit the router places by.

    LLMEngine.step ──(scheduled batch, seconds)──> StepCostFeed.observe
        ──> StepCostModel (tandem/common/step_costs.py): base, per row, per prompt token
        ──> observer(rows, tokens, context, seconds): a worker's --step-log, when set

A one-token query (plus drafts) is a decode row, anything longer is prompt tokens. On a GPU a
step that samples is timed to its end (sampling reads the logits); a chunk step that samples
nothing is timed at its launch.

The engine's first step with prompt tokens and its first without are left out of the fit
(the observer still gets them): they pay first-call costs (thread pools, allocations, page
faults; on a 2-core CPU a prefill worker's first 40-token step took 0.9-1.1 s against ~0.1 s
after), and one such step made a fresh prefill worker's fit report a 0.4-0.6 s base for as
long as few prompts reached it, so the router placed every short prompt locally. Steps with
a LoRA row follow another cost curve than the base steps the router places by (the adapters'
deltas on top) and stay out of the fit too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tandem.common.step_costs import StepCostModel, StepCosts
from tandem.engine.core.scheduler import ScheduledRequest

# (decode rows, prompt tokens, context tokens the queries attend to, seconds)
StepObserver = Callable[[int, int, int, float], None]


class StepCostFeed:
    """The engine's step-cost fit and who else watches each step's cost."""

    def __init__(self) -> None:
        self.model = StepCostModel()
        self._cold_kinds_seen: set[bool] = set()  # step kinds (prompt tokens or not) seen once
        # called after every step that ran the model, on the thread that steps
        self.observer: StepObserver | None = None

    def costs(self) -> StepCosts:
        """The fit right now."""
        return self.model.costs()

    def observe(self, scheduled: Sequence[ScheduledRequest], seconds: float,
                adapted: bool) -> None:
        """A step of ``scheduled`` took ``seconds``; ``adapted``: a row ran under a LoRA
        adapter."""
        rows = sum(1 for s in scheduled if s.num_new_tokens == 1)
        tokens = sum(s.num_new_tokens for s in scheduled if s.num_new_tokens > 1)
        kind = tokens > 0
        if kind in self._cold_kinds_seen and not adapted:
            self.model.observe(rows, tokens, seconds)
        else:
            self._cold_kinds_seen.add(kind)
        if self.observer is not None:
            context = sum(s.request.num_computed_tokens for s in scheduled)
            self.observer(rows, tokens, context, seconds)
