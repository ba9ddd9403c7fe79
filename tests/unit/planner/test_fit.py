"""tandem/planner/fit.py: the step-cost fit recovers known costs and keeps every cost >= 0."""

from __future__ import annotations

import random

import pytest

from tandem.planner.fit import (
    StepSample,
    fit_step_cost,
    median_of_rounds,
    prefill_context,
    round_spread,
)
from tandem.planner.profile import StepCost


def _samples(cost: StepCost, noise: float = 0.0, seed: int = 0) -> list[StepSample]:
    rng = random.Random(seed)
    shapes = [(0, n, 0, prefill_context(n)) for n in (16, 64, 256, 1024, 2048)]
    shapes += [(b, 0, b * ctx, 0) for b in (1, 4, 16, 64) for ctx in (32, 512)]
    shapes += [(8, 256, 8 * 64, prefill_context(256))]
    out = []
    for rows, tokens, context, pairs in shapes:
        t = cost.step_s(rows, tokens, context, pairs) * (1 + rng.uniform(-noise, noise))
        out.append(StepSample(rows, tokens, context, t, pairs))
    return out


def test_recovers_exact_costs() -> None:
    truth = StepCost(8e-3, 5e-5, 2e-5, 3e-9, 4e-10)
    fit = fit_step_cost(_samples(truth))
    for got, want in zip((fit.cost.base_s, fit.cost.per_row_s, fit.cost.per_prefill_token_s,
                          fit.cost.per_context_token_s, fit.cost.per_prefill_pair_s),
                         (truth.base_s, truth.per_row_s, truth.per_prefill_token_s,
                          truth.per_context_token_s, truth.per_prefill_pair_s), strict=True):
        assert got == pytest.approx(want, rel=1e-6)
    assert fit.max_relative_error < 1e-9


def test_noisy_samples_stay_close_and_report_their_error() -> None:
    truth = StepCost(8e-3, 5e-5, 2e-5, 0.0)
    fit = fit_step_cost(_samples(truth, noise=0.05, seed=3))
    assert fit.cost.base_s == pytest.approx(truth.base_s, rel=0.1)
    assert fit.cost.per_prefill_token_s == pytest.approx(truth.per_prefill_token_s, rel=0.1)
    assert 0 < fit.rms_relative_error <= 0.05 and fit.max_relative_error <= 0.1


def test_a_cost_the_data_makes_negative_is_clamped_to_zero() -> None:
    # Decode steps that get *cheaper* with context: the unconstrained fit would go negative.
    samples = [StepSample(0, n, 0, 1e-3 + 1e-5 * n, prefill_context(n)) for n in (16, 64, 256)]
    samples += [StepSample(4, 0, ctx, 2e-3 - 1e-9 * ctx) for ctx in (100, 1000, 10000)]
    fit = fit_step_cost(samples)
    c = fit.cost
    assert min(c.base_s, c.per_row_s, c.per_prefill_token_s, c.per_context_token_s) >= 0
    assert c.per_context_token_s == 0.0


def test_too_few_or_bad_samples_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 5"):
        fit_step_cost([StepSample(1, 0, 1, 1e-3)] * 4)
    with pytest.raises(ValueError, match="seconds > 0"):
        fit_step_cost([StepSample(1, 0, 1, 0.0)] * 5)


def test_prefill_context_counts_causal_positions() -> None:
    assert prefill_context(1) == 1
    assert prefill_context(3) == 1 + 2 + 3
    assert prefill_context(2, offset=10) == 11 + 12


def test_token_curve_recovers_a_kinked_step_cost() -> None:
    from tandem.planner.fit import fit_token_curve

    # A CPU-like engine: 5 ms a token up to 8 tokens, then 2 ms a token; attention extra.
    def shape(n: int) -> float:
        return 0.004 + (0.005 * n if n <= 8 else 0.040 + 0.002 * (n - 8))

    per_ctx, per_pair = 2e-6, 5e-9
    samples = [StepSample(0, n, 0, shape(n) + per_pair * prefill_context(n),
                          prefill_context(n)) for n in (16, 64, 256, 1024)]
    samples += [StepSample(b, 0, b * ctx, shape(b) + per_ctx * b * ctx)
                for b in (1, 2, 4, 8, 16, 64) for ctx in (32, 512)]
    linear = fit_step_cost(samples)
    fit = fit_token_curve(samples, linear.cost)
    c = fit.cost
    assert fit.max_relative_error < 1e-6 < linear.max_relative_error
    assert c.per_context_token_s == pytest.approx(per_ctx, rel=1e-6)
    assert c.per_prefill_pair_s == pytest.approx(per_pair, rel=1e-6)
    for n in (1, 4, 8, 16, 40, 64, 256):
        assert c.shape_s(n) == pytest.approx(shape(n), rel=1e-6)
    assert c.shape_s(3, 5) == pytest.approx(shape(8), rel=1e-6)  # rows and tokens add up
    # the router-visible linear part is the linear fit's
    assert (c.base_s, c.per_row_s) == (linear.cost.base_s, linear.cost.per_row_s)


def test_curve_points_are_validated_and_round_trip() -> None:
    from tandem.planner.profile import ProfileError

    with pytest.raises(ProfileError, match="ascending"):
        StepCost(0.01, 0.0, 0.0, curve=((8, 0.1), (4, 0.05)))
    c = StepCost(0.01, 0.0, 0.0, curve=[[1, 0.01], [8, 0.05]])
    assert c.curve == ((1.0, 0.01), (8.0, 0.05))
    assert c.shape_s(16) == pytest.approx(0.05 + 8 * 0.04 / 7)


def test_costs_the_samples_cannot_tell_apart_do_not_break_the_fit() -> None:
    """Prefill-only samples say nothing of decode rows or their context: those columns are
    all zero, the normal equations singular. The fit gives them 0 and fits the rest (it
    raised 'singular system' before; a profile run hit it when the active-set loop dropped
    the column that separated two others)."""
    samples = [StepSample(0, n, 0, 0.002 + 1e-5 * n, prefill_context(n))
               for n in (16, 64, 256, 1024, 2048)]
    fit = fit_step_cost(samples)
    c = fit.cost
    assert c.per_row_s == 0 and c.per_context_token_s == 0
    assert fit.max_relative_error < 1e-3


def test_a_slow_round_of_each_shape_does_not_move_the_fit() -> None:
    """Three rounds of every shape, each shape slowed 1.6x in one round (a different round
    for different shapes, as a machine's slow spell lands): the medians are the true times,
    so the fit recovers the costs; fitting the raw timings does not."""
    truth = StepCost(8e-3, 5e-5, 2e-5, 3e-9, 4e-10)
    base = _samples(truth)
    rounds = [[StepSample(s.rows, s.prefill_tokens, s.context_tokens,
                          s.seconds * (1.6 if i % 3 == r else 1.0), s.prefill_pairs)
               for i, s in enumerate(base)] for r in range(3)]
    medians = median_of_rounds(rounds)
    assert [m.seconds for m in medians] == [s.seconds for s in base]
    assert fit_step_cost(medians).max_relative_error < 1e-9
    assert fit_step_cost([s for r in rounds for s in r]).max_relative_error > 0.1
    assert round_spread(rounds) == pytest.approx([1.6] * len(base))


def test_rounds_of_different_steps_are_refused() -> None:
    a = [StepSample(1, 0, 32, 0.01), StepSample(2, 0, 64, 0.02)]
    b = [StepSample(1, 0, 32, 0.01), StepSample(2, 0, 66, 0.02)]
    with pytest.raises(ValueError, match="different steps"):
        median_of_rounds([a, b])
    with pytest.raises(ValueError, match="different steps"):
        median_of_rounds([a, a[:1]])
    assert median_of_rounds([a]) == a and median_of_rounds([]) == []
    assert round_spread([a]) == [1.0, 1.0]
