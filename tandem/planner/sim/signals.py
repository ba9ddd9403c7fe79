"""What a simulated worker reports as its step cost: its own online fit, as a real worker does.

A real worker fits ``base + per_row * rows + per_prefill_token * tokens`` over its recent
steps (tandem/common/step_costs.py, recursive least squares with forgetting) and reports the fit;
the router's placement (tandem/placement/cost_model.py) predicts TTFT and the decode token gap
from it. The fit is linear where a step is not: it folds the rows' context, the host's
other worker and the serving loop's overhead into its three numbers, weighted by the steps
the worker happened to run. So the same placement code decides differently from the fit
than from the profile's exact costs.

``ClusterSpec(signals="fitted")`` (the default) gives every simulated worker a
:class:`FittedSignals`: it observes the steps the worker runs (a decode macro step is one
``observe_run``; a prefill step or a decode step with local prefill one ``observe``), after
the steps a real worker's start-up warm-up runs (tandem/common/warmup_plan.py, the same for both
roles, its two cold steps left out as the engine leaves them out) at the profile's costs.
``"profile"``: the profile's costs, exact (the simulator before this; the macro-step
reference tests compare with it too).
"""

from __future__ import annotations

from tandem.common.step_costs import StepCostModel, StepCosts
from tandem.common.warmup_plan import WarmupStep, warmup_phases, warmup_steps
from tandem.planner.profile import Profile

SIGNALS = ("fitted", "profile")


class FittedSignals:
    """One worker's online step-cost fit and what it reports (:meth:`costs`)."""

    __slots__ = ("_model", "_costs")

    def __init__(self, profile: Profile) -> None:
        self._model = StepCostModel()
        for s in profile_warmup_steps(profile):
            if not s.cold:  # a prefill step's prompts start from no context (their pairs)
                context = s.context_tokens if s.rows else 0
                self._model.observe(s.rows, s.prompt_tokens, profile.step.step_s(
                    s.rows, s.prompt_tokens, context, s.prefill_pairs))
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


def reported_costs(profile: Profile, signals: FittedSignals | None
                   ) -> tuple[float, float, float]:
    """``(base_s, per_row_s, per_prefill_token_s)`` a simulated worker reports: its own fit
    (``signals``), or without one the profile's step costs, exact."""
    if signals is None:
        step = profile.step
        return step.base_s, step.per_row_s, step.per_prefill_token_s
    fit = signals.costs()
    return fit.base_s, fit.per_row_s, fit.per_prefill_token_s


def profile_warmup_steps(profile: Profile) -> list[WarmupStep]:
    """The start-up warm-up's steps on a worker with ``profile``'s limits (its KV capacity
    stands for the context length, which a profile does not record)."""
    return warmup_steps(warmup_phases(profile.kv_capacity_tokens, profile.kv_capacity_tokens,
                                      profile.max_num_seqs, profile.chunk_tokens))
