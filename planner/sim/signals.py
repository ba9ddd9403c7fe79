"""What a simulated worker reports as its step cost: its own online fit, as a real worker does.

A real worker fits ``base + per_row * rows + per_prefill_token * tokens`` over its recent
steps (common/step_costs.py, recursive least squares with forgetting) and reports the fit;
the router's placement (router/handoff/placement.py) predicts TTFT and the decode token gap
from it. The fit is linear where a step is not: it folds the rows' context, the host's
other worker and the serving loop's overhead into its three numbers, weighted by the steps
the worker happened to run. So the same placement code decides differently from the fit
than from the profile's exact costs.

``ClusterSpec(signals="fitted")`` (the default) gives every simulated worker a
:class:`FittedSignals`: it observes the steps the worker runs (a decode macro step is one
``observe_run``; a prefill step or a decode step with local prefill one ``observe``), after
warm-up steps from the worker's profile, the shapes of a few short requests (a real
worker's first requests or a benchmark's warm-up). ``"profile"``: the profile's costs, exact
(the simulator before this; the macro-step reference tests compare with it too).
"""

from __future__ import annotations

from common.step_costs import StepCostModel, StepCosts
from planner.profile import Profile

SIGNALS = ("fitted", "profile")

# Warm-up steps each worker's fit starts from: decode rows at WARMUP_CONTEXT tokens of
# context each, prompt sizes for a prefill worker, WARMUP_REPEATS steps of each shape.
WARMUP_ROWS = (1, 2, 4, 8)
WARMUP_CONTEXT = 256
WARMUP_PROMPTS = (64, 256, 1024)
WARMUP_REPEATS = 4


class FittedSignals:
    """One worker's online step-cost fit and what it reports (:meth:`costs`)."""

    __slots__ = ("_model", "_costs")

    def __init__(self, profile: Profile, decode: bool) -> None:
        self._model = StepCostModel()
        step, serving = profile.step, profile.serving_step_s
        for _ in range(WARMUP_REPEATS):
            if decode:
                for rows in WARMUP_ROWS:
                    self._model.observe(rows, 0, step.step_s(rows, 0, rows * WARMUP_CONTEXT)
                                        + serving)
            else:
                for tokens in WARMUP_PROMPTS:
                    self._model.observe(0, tokens, step.step_s(
                        0, tokens, prefill_pairs=tokens * (tokens + 1) // 2) + serving)
        self._costs: StepCosts | None = None

    def step(self, rows: int, prefill_tokens: int, seconds: float) -> None:
        """One step ran: ``rows`` decode rows, ``prefill_tokens`` prompt tokens."""
        self._model.observe(rows, prefill_tokens, seconds)
        self._costs = None

    def run(self, rows: int, first_s: float, growth_s: float, count: int) -> None:
        """``count`` decode steps of ``rows`` rows ran, lasting ``first_s + i * growth_s``."""
        self._model.observe_run(rows, 0, first_s, growth_s, count)
        self._costs = None

    def costs(self) -> StepCosts:
        """The fit as the worker reports it (None coefficients: not observed yet)."""
        if self._costs is None:
            self._costs = self._model.costs()
        return self._costs
