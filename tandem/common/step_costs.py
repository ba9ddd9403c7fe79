"""What one engine step costs, fitted online from measured step times.

A step runs ``rows`` decode rows (one token each, plus drafts) and ``prefill_tokens`` prompt
tokens (whole prompts or chunks). On every backend we have, its wall time is close to linear
in both::

    seconds ~= base + per_row * rows + per_prefill_token * prefill_tokens

``base`` is the weight read and launch overhead every step pays; ``per_row`` is what another
running stream adds; ``per_prefill_token`` is the prompt-token cost (attention's quadratic
part is folded in; it is small below a few thousand tokens). The router's placement model
(tandem/placement/cost_model.py) reads these three numbers from each worker's Stats to predict
TTFT and TPOT of prefilling a prompt here or elsewhere.

The fit is recursive least squares with exponential forgetting (old steps fade with a
half-life of ``half_life_steps``), so it follows a worker whose load or thermal state drifts.
A coefficient no step has exercised yet (a decode-only worker that never prefilled) is
reported as unknown (None) rather than guessed.

Forgetting divides the covariance by the forgetting factor every step, and a direction no
step varies in (a decode worker whose batch stays at the same size, a prompt-token cost that
rarely shows) is never shrunk back: unbounded, it grows past 1e100 within 20,000 steps and
one noisy step then throws the estimate to 1e13 s or NaN. So the covariance is bounded by
the prior's (its trace at most the prior's, and reset to the prior if rounding ever makes it
non-finite or not positive): an unexcited direction keeps the prior's uncertainty, no more.

It lives in tandem/common/ because two kinds of worker fit it: the engine's (every real step) and
the planner's simulated ones (tandem/planner/sim/), so the router's placement reads the same kind of
numbers in a simulation as in a deployment. ``observe_run`` folds a run of steps of one shape
whose times grow linearly (a simulated macro step) in one update.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Features are scaled to O(1) so the 3x3 solve stays well conditioned.
_ROW_SCALE = 64.0
_TOKEN_SCALE = 512.0
_PRIOR = 1e3  # initial covariance: a weak prior at zero cost
# observe_run's steps per update: the covariance bound is applied between pieces (a run of
# 8,000 steps, bound binding, ends within 0.1% of step by step; one piece: 1.5%).
RUN_PIECE = 64


@dataclass(frozen=True, slots=True)
class StepCosts:
    """The fitted step cost (seconds); a None coefficient has not been observed yet."""

    base_s: float | None = None
    per_row_s: float | None = None
    per_prefill_token_s: float | None = None
    steps: int = 0  # steps the fit has seen

    def step_s(self, rows: int, prefill_tokens: int) -> float | None:
        """Predicted time of a step of this shape; None when a needed part is unknown."""
        if self.base_s is None:
            return None
        total = self.base_s
        if rows:
            if self.per_row_s is None:
                return None
            total += self.per_row_s * rows
        if prefill_tokens:
            if self.per_prefill_token_s is None:
                return None
            total += self.per_prefill_token_s * prefill_tokens
        return total


class StepCostModel:
    """Online fit of :class:`StepCosts` (engine thread only; no locking)."""

    def __init__(self, half_life_steps: float = 200.0) -> None:
        if half_life_steps <= 0:
            raise ValueError(f"half_life_steps must be > 0, got {half_life_steps}")
        self._forget = 0.5 ** (1.0 / half_life_steps)
        self._theta = [0.0, 0.0, 0.0]
        self._p = [[_PRIOR if i == j else 0.0 for j in range(3)] for i in range(3)]
        self._seen_rows = False
        self._seen_tokens = False
        self._steps = 0

    def observe(self, rows: int, prefill_tokens: int, seconds: float) -> None:
        """Fold one measured step into the fit (a non-finite or negative time is ignored)."""
        if not math.isfinite(seconds) or seconds < 0 or (rows <= 0 and prefill_tokens <= 0):
            return
        x0, x1, x2 = 1.0, rows / _ROW_SCALE, prefill_tokens / _TOKEN_SCALE
        (p00, p01, p02), (p10, p11, p12), (p20, p21, p22) = self._p
        lam = self._forget
        px = (p00 * x0 + p01 * x1 + p02 * x2, p10 * x0 + p11 * x1 + p12 * x2,
              p20 * x0 + p21 * x1 + p22 * x2)
        denom = lam + (x0 * px[0] + x1 * px[1] + x2 * px[2])
        gain = (px[0] / denom, px[1] / denom, px[2] / denom)
        t0, t1, t2 = self._theta
        err = seconds - (t0 * x0 + t1 * x1 + t2 * x2)
        self._theta = [t0 + gain[0] * err, t1 + gain[1] * err, t2 + gain[2] * err]
        # P <- (P - k x^T P) / lambda, kept symmetric and bounded (the module docstring).
        p = self._p
        self._p = _bounded([[(p[i][j] - gain[i] * px[j]) / lam for j in range(3)]
                            for i in range(3)])
        if not all(math.isfinite(v) for v in self._theta):
            self._theta = [0.0, 0.0, 0.0]
        self._seen_rows |= rows > 0
        self._seen_tokens |= prefill_tokens > 0
        self._steps += 1

    def observe_run(self, rows: int, prefill_tokens: int, first_s: float, growth_s: float,
                    count: int) -> None:
        """Fold ``count`` steps of one shape, the i-th lasting ``first_s + i * growth_s``.

        In pieces of at most ``RUN_PIECE`` steps, each one update in the information form
        (``A = P^-1``, ``b = A theta``: forgetting scales both by lambda per step, a step adds
        ``x x^T`` and ``x y``): ``count`` calls of :meth:`observe` exactly while the
        covariance bound does not bind; where it does, it is applied after each piece
        instead of after every step."""
        if count <= 0 or (rows <= 0 and prefill_tokens <= 0):
            return
        if not (math.isfinite(first_s) and math.isfinite(growth_s)) or first_s < 0 or (
                first_s + (count - 1) * growth_s < 0):
            return
        x = [1.0, rows / _ROW_SCALE, prefill_tokens / _TOKEN_SCALE]
        done = 0
        while done < count:
            n = min(RUN_PIECE, count - done)
            if n == 1 or not self._fold(x, first_s + done * growth_s, growth_s, n):
                for i in range(n):
                    self.observe(rows, prefill_tokens, first_s + (done + i) * growth_s)
            done += n
        self._seen_rows |= rows > 0
        self._seen_tokens |= prefill_tokens > 0

    def _fold(self, x: list[float], first_s: float, growth_s: float, n: int) -> bool:
        """``n`` steps with features ``x`` in one information-form update (False: the
        covariance cannot be inverted here; nothing changed)."""
        lam = self._forget
        a = _inverse3(self._p)
        if a is None:
            return False
        lam_n = lam ** n
        s = (1.0 - lam_n) / (1.0 - lam)  # sum of lam^i, i < n
        sj = lam * (1.0 - n * lam ** (n - 1) + (n - 1) * lam_n) / (1.0 - lam) ** 2
        weighted_y = first_s * s + growth_s * ((n - 1) * s - sj)  # sum lam^(n-1-i) y_i
        t0, t1, t2 = self._theta
        x0, x1, x2 = x
        b = [lam_n * (row[0] * t0 + row[1] * t1 + row[2] * t2) + xi * weighted_y
             for row, xi in zip(a, x, strict=True)]
        sx = (s * x0, s * x1, s * x2)
        p = _inverse3([[lam_n * a[i][0] + sx[i] * x0, lam_n * a[i][1] + sx[i] * x1,
                        lam_n * a[i][2] + sx[i] * x2] for i in range(3)])
        if p is None:
            return False
        theta = [row[0] * b[0] + row[1] * b[1] + row[2] * b[2] for row in p]
        self._theta = theta if all(math.isfinite(v) for v in theta) else [0.0, 0.0, 0.0]
        self._p = _bounded(p)
        self._steps += n
        return True

    def costs(self) -> StepCosts:
        """The current fit; negative coefficients (noise early on) are clamped to zero."""
        if self._steps == 0:
            return StepCosts()
        base, row, tok = (max(v, 0.0) for v in self._theta)
        return StepCosts(
            base_s=base,
            per_row_s=row / _ROW_SCALE if self._seen_rows else None,
            per_prefill_token_s=tok / _TOKEN_SCALE if self._seen_tokens else None,
            steps=self._steps,
        )


def _bounded(p: list[list[float]]) -> list[list[float]]:
    """``p`` made symmetric, its trace at most the prior's, the prior where it is broken."""
    (p00, p01, p02), (p10, p11, p12), (p20, p21, p22) = p
    a01, a02, a12 = (p01 + p10) / 2, (p02 + p20) / 2, (p12 + p21) / 2
    # (v + v) / 2 == v for a finite diagonal entry: the symmetric matrix's own diagonal
    q = [[(p00 + p00) / 2, a01, a02], [a01, (p11 + p11) / 2, a12], [a02, a12, (p22 + p22) / 2]]
    trace = q[0][0] + q[1][1] + q[2][2]
    if not math.isfinite(trace + a01 + a02 + a12) or min(q[0][0], q[1][1], q[2][2]) <= 0:
        return [[_PRIOR if i == j else 0.0 for j in range(3)] for i in range(3)]
    if trace > 3 * _PRIOR:
        return [[v * 3 * _PRIOR / trace for v in row] for row in q]
    return q


def _inverse3(m: list[list[float]]) -> list[list[float]] | None:
    """The inverse of a 3x3 matrix (cofactors); None when it is singular or not finite."""
    (a, b, c), (d, e, f), (g, h, i) = m
    co = [[e * i - f * h, c * h - b * i, b * f - c * e],
          [f * g - d * i, a * i - c * g, c * d - a * f],
          [d * h - e * g, b * g - a * h, a * e - b * d]]
    det = a * co[0][0] + b * co[1][0] + c * co[2][0]
    if not math.isfinite(det) or det == 0.0:
        return None
    return [[v / det for v in row] for row in co]
