"""Fit a profile's step-cost model to measured engine steps (least squares, costs >= 0).

``tandem profile`` times real engine steps of known shape and hands them here::

    seconds ~= base + per_row * rows + per_prefill_token * prefill_tokens
               + per_context_token * context_tokens + per_prefill_pair * prefill_pairs

The five coefficients are the least-squares solution with every coefficient kept >= 0: a
coefficient the unconstrained fit makes negative (noise, or a term the samples barely
exercise) is fixed at 0 and the rest refitted, until all are >= 0 (an active-set loop; with
five unknowns it ends within five rounds). Pure Python: a 5x5 solve needs no numpy.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from tandem.planner.profile import StepCost

RIDGE = 1e-9  # added to a singular system's diagonal (see _least_squares)


@dataclass(frozen=True, slots=True)
class StepSample:
    """One timed step: its shape and wall seconds."""

    rows: int  # decode rows (one token each)
    prefill_tokens: int  # prompt tokens computed in the step
    context_tokens: int  # KV positions the decode rows read (see tandem/planner/profile.py)
    seconds: float
    prefill_pairs: int = 0  # query-key pairs of the prefill chunks (prefill_context)

    def features(self) -> tuple[float, float, float, float, float]:
        return (1.0, float(self.rows), float(self.prefill_tokens), float(self.context_tokens),
                float(self.prefill_pairs))


@dataclass(frozen=True, slots=True)
class Fit:
    """The fitted cost and how well it explains the samples."""

    cost: StepCost
    rms_relative_error: float  # sqrt(mean(((predicted - measured) / measured)^2))
    max_relative_error: float


def median_of_rounds(rounds: Sequence[Sequence[StepSample]]) -> list[StepSample]:
    """One sample per timed step from several rounds of the same steps: the median seconds
    over the rounds (the shape is the first round's). ``tandem profile`` times every shape
    once per round, so a slow spell of a shared machine lands on one round of each shape,
    not on all timings of a few shapes; the median drops it. Rounds must time the same
    steps in the same order (ValueError otherwise)."""
    if not rounds:
        return []
    first = rounds[0]
    for r in rounds[1:]:
        same = len(r) == len(first) and all(
            (a.rows, a.prefill_tokens, a.context_tokens, a.prefill_pairs)
            == (b.rows, b.prefill_tokens, b.context_tokens, b.prefill_pairs)
            for a, b in zip(r, first, strict=True))
        if not same:
            raise ValueError("rounds timed different steps; cannot take medians")
    return [StepSample(s.rows, s.prefill_tokens, s.context_tokens,
                       statistics.median(r[i].seconds for r in rounds), s.prefill_pairs)
            for i, s in enumerate(first)]


def round_spread(rounds: Sequence[Sequence[StepSample]]) -> list[float]:
    """Per timed step, the slowest round's seconds over the fastest's (1.0 = no spread):
    how much the machine drifted while the profile ran."""
    if len(rounds) < 2:
        return [1.0] * (len(rounds[0]) if rounds else 0)
    return [max(r[i].seconds for r in rounds) / min(r[i].seconds for r in rounds)
            for i in range(len(rounds[0]))]


def prefill_context(tokens: int, offset: int = 0) -> int:
    """KV positions a prefill chunk of ``tokens`` after ``offset`` cached ones attends to
    (token i sees offset + i + 1 positions, causal)."""
    return tokens * offset + tokens * (tokens + 1) // 2


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting; raises ValueError when singular."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-300:
            raise ValueError("singular system: the samples do not determine the costs")
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                for c in range(col, n + 1):
                    m[r][c] -= f * m[col][c]
    return [m[i][n] / m[i][i] for i in range(n)]


def _least_squares(rows: list[list[float]], seconds: list[float], free: list[int]
                   ) -> list[float]:
    """Relative-error least squares over the ``free`` columns (the others are 0).

    Each sample is weighted by 1 / seconds, so a 5 ms decode step counts as much as a 2 s
    prefill: the fit minimises relative, not absolute, error.
    """
    a = [[r[j] / y for j in free] for r, y in zip(rows, seconds, strict=True)]
    # Normal equations, with features rescaled to O(1) so the solve stays well conditioned.
    scale = [max(abs(r[k]) for r in a) or 1.0 for k in range(len(free))]
    scaled = [[r[k] / scale[k] for k in range(len(free))] for r in a]
    ata = [[sum(r[i] * r[j] for r in scaled) for j in range(len(free))]
           for i in range(len(free))]
    atb = [sum(r[i] for r in scaled) for i in range(len(free))]
    try:
        sol = _solve(ata, atb)
    except ValueError:
        # Columns the samples cannot tell apart (say, once the active-set loop dropped the one
        # that separated them): a trace of ridge makes them share their weight. Only then: on
        # a determined but ill-conditioned fit even 1e-9 moves a coefficient by ~0.4%.
        for i in range(len(free)):
            ata[i][i] += RIDGE
        sol = _solve(ata, atb)
    return [sol[k] / scale[k] for k in range(len(free))]


def _nonnegative(rows: list[list[float]], seconds: list[float]) -> list[float]:
    """Least squares with every coefficient >= 0 (drop the negatives, refit, repeat)."""
    free = list(range(len(rows[0])))
    coef = [0.0] * len(free)
    while free:
        sol = _least_squares(rows, seconds, free)
        if all(v >= 0 for v in sol):
            for k, v in zip(free, sol, strict=True):
                coef[k] = v
            break
        free = [k for k, v in zip(free, sol, strict=True) if v > 0]
    return coef


def _errors(cost: StepCost, samples: Sequence[StepSample]) -> tuple[float, float]:
    errors = [(cost.step_s(s.rows, s.prefill_tokens, s.context_tokens, s.prefill_pairs)
               - s.seconds) / s.seconds for s in samples]
    return (sum(e * e for e in errors) / len(errors)) ** 0.5, max(abs(e) for e in errors)


def _check(samples: Sequence[StepSample], unknowns: int) -> None:
    if len(samples) < unknowns:
        raise ValueError(f"need at least {unknowns} timed steps to fit {unknowns} costs, "
                         f"got {len(samples)}")
    if any(s.seconds <= 0 for s in samples):
        raise ValueError("every sample needs seconds > 0")


def fit_step_cost(samples: Sequence[StepSample]) -> Fit:
    """The non-negative least-squares step cost for ``samples`` (at least 5, seconds > 0)."""
    _check(samples, 5)
    coef = _nonnegative([list(s.features()) for s in samples], [s.seconds for s in samples])
    cost = StepCost(*coef)
    return Fit(cost, *_errors(cost, samples))


def _hats(n: float, knots: Sequence[float]) -> list[float]:
    """Piecewise-linear interpolation weights of ``n`` on ``knots`` (ends extended)."""
    w = [0.0] * len(knots)
    if len(knots) == 1:
        w[0] = 1.0
        return w
    i = 1
    while i < len(knots) - 1 and knots[i] < n:
        i += 1
    f = (n - knots[i - 1]) / (knots[i] - knots[i - 1])
    w[i - 1], w[i] = 1 - f, f
    return w


def fit_token_curve(samples: Sequence[StepSample], linear: StepCost) -> Fit:
    """``linear`` with a token curve added: the step's seconds at each distinct total of new
    tokens (rows + prompt tokens) the samples have, a decode row's extra, and the two
    attention coefficients, fitted together (non-negative, relative error). The linear coefficients are kept as
    they are: they are what the router sees."""
    knots = sorted({float(s.rows + s.prefill_tokens) for s in samples})
    _check(samples, len(knots) + 3)
    rows = [_hats(s.rows + s.prefill_tokens, knots) + [float(s.rows), float(s.context_tokens),
                                                       float(s.prefill_pairs)]
            for s in samples]
    coef = _nonnegative(rows, [s.seconds for s in samples])
    cost = StepCost(linear.base_s, linear.per_row_s, linear.per_prefill_token_s,
                    coef[-2], coef[-1], tuple(zip(knots, coef[:-3], strict=True)), coef[-3])
    return Fit(cost, *_errors(cost, samples))
