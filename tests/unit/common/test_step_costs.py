"""The online step-cost fit recovers known linear costs and follows drift."""

from __future__ import annotations

import math
import random

import pytest

from tandem.common.step_costs import StepCostModel, StepCosts


def _feed(model: StepCostModel, n: int, base: float, row: float, tok: float, seed: int = 0,
          noise: float = 0.03) -> None:
    rng = random.Random(seed)
    for _ in range(n):
        rows = rng.randint(0, 16)
        tokens = rng.choice([0, 0, 0, rng.randint(1, 512)])
        if rows == 0 and tokens == 0:
            rows = 1
        t = base + row * rows + tok * tokens
        model.observe(rows, tokens, t * (1 + rng.gauss(0, noise)))


def test_recovers_the_coefficients() -> None:
    model = StepCostModel()
    _feed(model, 400, 0.03, 0.002, 0.0004)
    c = model.costs()
    assert c.steps == 400
    assert c.base_s == pytest.approx(0.03, rel=0.05)
    assert c.per_row_s == pytest.approx(0.002, rel=0.05)
    assert c.per_prefill_token_s == pytest.approx(0.0004, rel=0.05)
    assert c.step_s(8, 256) == pytest.approx(0.03 + 0.016 + 0.1024, rel=0.05)


def test_follows_drift() -> None:
    model = StepCostModel(half_life_steps=50)
    _feed(model, 300, 0.03, 0.002, 0.0004, seed=1)
    _feed(model, 300, 0.06, 0.004, 0.0008, seed=2)  # the machine got twice as slow
    c = model.costs()
    assert c.per_prefill_token_s == pytest.approx(0.0008, rel=0.1)
    assert c.base_s == pytest.approx(0.06, rel=0.1)


def test_unobserved_parts_are_unknown() -> None:
    assert StepCostModel().costs() == StepCosts()
    model = StepCostModel()
    for _ in range(50):
        model.observe(1, 0, 0.04)  # decode only: the prompt-token cost is unknown
    c = model.costs()
    assert c.per_prefill_token_s is None
    assert c.step_s(1, 0) == pytest.approx(0.04, rel=1e-3)
    assert c.step_s(1, 10) is None
    prefill_only = StepCostModel()
    for n in (100, 200, 300, 400):
        prefill_only.observe(0, n, 0.01 + 0.001 * n)
    c = prefill_only.costs()
    assert c.per_row_s is None and c.step_s(1, 0) is None
    assert c.step_s(0, 250) == pytest.approx(0.26, rel=0.02)


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -1.0])
def test_ignores_bad_times(seconds: float) -> None:
    model = StepCostModel()
    model.observe(4, 0, seconds)
    model.observe(0, 0, 1.0)  # an empty step says nothing
    assert model.costs() == StepCosts()


def test_rejects_bad_half_life() -> None:
    with pytest.raises(ValueError):
        StepCostModel(half_life_steps=0)


def test_a_batch_that_never_changes_size_does_not_wind_up() -> None:
    """A decode worker whose batch stays at two rows and rarely prefills: forgetting used to
    inflate the covariance in the directions no step varies (past 1e100) until one noisy step
    threw the fit to 1e13 s or NaN, which the router's placement and the autoscaler read."""
    model = StepCostModel(half_life_steps=20)
    rng = random.Random(0)
    for _ in range(20_000):
        rows = 2 if rng.random() < 0.995 else rng.choice([1, 3])
        tokens = 8 if rng.random() < 0.002 else 0
        model.observe(rows, tokens, 0.004 + 0.0006 * rows + rng.gauss(0, 0.002))
        c = model.costs()
        assert c.base_s is not None and 0 <= c.base_s < 0.05
        assert c.per_row_s is not None and 0 <= c.per_row_s < 0.05
    assert c.step_s(2, 0) == pytest.approx(0.0052, rel=0.5)  # the load it runs at: known


def _run_shapes() -> list[tuple[int, int, float, float, int]]:
    """(rows, tokens, first, growth, count): decode runs of growing steps, a few prefills."""
    rng = random.Random(5)
    shapes = []
    for _ in range(60):
        if rng.random() < 0.2:
            shapes.append((rng.randint(0, 3), rng.randint(50, 2000), 0.2 * rng.random(), 0.0, 1))
        else:
            rows = rng.randint(1, 8)
            shapes.append((rows, 0, 0.01 + 0.003 * rows, 1e-5 * rows, rng.randint(1, 60)))
    return shapes


def _fed(shapes: list[tuple[int, int, float, float, int]], runs: bool) -> StepCosts:
    model = StepCostModel()
    for rows, tokens, first, growth, count in shapes:
        if runs:
            model.observe_run(rows, tokens, first, growth, count)
        else:
            for i in range(count):
                model.observe(rows, tokens, first + i * growth)
    return model.costs()


def test_a_run_of_steps_is_the_same_fit_as_its_steps_one_by_one() -> None:
    """observe_run (the simulator's macro steps) in closed form: exactly the fit of observing
    each step while the covariance bound does not bind."""
    step_by_step, folded = _fed(_run_shapes(), False), _fed(_run_shapes(), True)
    assert folded.steps == step_by_step.steps
    for name in ("base_s", "per_row_s", "per_prefill_token_s"):
        assert getattr(folded, name) == pytest.approx(getattr(step_by_step, name), rel=1e-9)


def test_long_runs_stay_close_where_the_covariance_bound_binds() -> None:
    """Thousands of steps at one shape (the prompt-token direction unexcited, so the bound
    binds every step): the bound applied per piece of RUN_PIECE steps keeps the fit within
    0.5% of step by step."""
    shapes = [(1, 512, 1.0, 0.0, 1)] + [(r, 0, 0.01 + 0.003 * r, 2e-6 * r, 800)
                                         for r in (1, 2, 3, 2, 1, 4)]
    shapes += [(2, 300, 0.6, 0.0, 1), (3, 0, 0.02, 0.0, 3000)]
    step_by_step, folded = _fed(shapes, False), _fed(shapes, True)
    for name in ("base_s", "per_row_s", "per_prefill_token_s"):
        assert getattr(folded, name) == pytest.approx(getattr(step_by_step, name), rel=5e-3)


def test_a_run_ignores_what_observe_ignores() -> None:
    model = StepCostModel()
    model.observe_run(0, 0, 0.01, 0.0, 10)  # empty steps
    model.observe_run(2, 0, math.nan, 0.0, 10)
    model.observe_run(2, 0, 0.01, -0.001, 20)  # would end below zero
    model.observe_run(2, 0, 0.01, 0.0, 0)
    assert model.costs() == StepCosts()
    model.observe_run(2, 0, 0.01, 0.0, 1)  # one step: observe
    assert model.costs().steps == 1
