"""What one engine step costs, fitted online from measured step times.

A step runs ``rows`` decode rows (one token each, plus drafts) and ``prefill_tokens`` prompt
tokens (whole prompts or chunks). On every backend we have, its wall time is close to linear
in both::

    seconds ~= base + per_row * rows + per_prefill_token * prefill_tokens

``base`` is the weight read and launch overhead every step pays; ``per_row`` is what another
running stream adds; ``per_prefill_token`` is the prompt-token cost (attention's quadratic
part is folded in; it is small below a few thousand tokens). The router's placement model
(router/handoff/placement.py) reads these three numbers from each worker's Stats to predict
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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Features are scaled to O(1) so the 3x3 solve stays well conditioned.
_ROW_SCALE = 64.0
_TOKEN_SCALE = 512.0
_PRIOR = 1e3  # initial covariance: a weak prior at zero cost


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
        x = [1.0, rows / _ROW_SCALE, prefill_tokens / _TOKEN_SCALE]
        p, lam = self._p, self._forget
        px = [sum(p[i][j] * x[j] for j in range(3)) for i in range(3)]
        denom = lam + sum(x[i] * px[i] for i in range(3))
        gain = [v / denom for v in px]
        err = seconds - sum(self._theta[i] * x[i] for i in range(3))
        self._theta = [self._theta[i] + gain[i] * err for i in range(3)]
        # P <- (P - k x^T P) / lambda, kept symmetric and bounded (the module docstring).
        new = [[(p[i][j] - gain[i] * px[j]) / lam for j in range(3)] for i in range(3)]
        new = [[(new[i][j] + new[j][i]) / 2 for j in range(3)] for i in range(3)]
        trace = new[0][0] + new[1][1] + new[2][2]
        if not all(math.isfinite(v) for row in new for v in row) or min(
                new[i][i] for i in range(3)) <= 0:
            new = [[_PRIOR if i == j else 0.0 for j in range(3)] for i in range(3)]
        elif trace > 3 * _PRIOR:
            new = [[v * 3 * _PRIOR / trace for v in row] for row in new]
        self._p = new
        if not all(math.isfinite(v) for v in self._theta):
            self._theta = [0.0, 0.0, 0.0]
        self._seen_rows |= rows > 0
        self._seen_tokens |= prefill_tokens > 0
        self._steps += 1

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
