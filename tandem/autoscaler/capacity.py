"""What one worker can carry inside the SLO, from its fitted step cost (pure arithmetic).

Every worker fits its engine step online (tandem/common/step_costs.py) and reports it in its
Stats: ``step seconds = base + per_row * decode rows + per_prefill_token * prompt tokens``.
From that::

    prefill worker   full chunks of C prompt tokens:  tokens/s = C / (base + per_token * C)
    decode worker    the largest batch B whose step fits the step target (a share of the
                     TPOT target), capped by the row limit:
                     B = floor((target - base) / per_row),  tokens/s = B / (base + per_row * B)

tandem/planner/sizing.py does the same sums on a profile's fuller step model (attention terms,
measured curves) for a first guess before anything runs; here the inputs are what the live
workers report, so the attention they pay on the current mix is already in their fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PrefillPrice:
    """A prefill worker's step cost: ``base_s`` per step, ``token_s`` per prompt token, at
    most ``chunk_tokens`` prompt tokens a step."""

    base_s: float
    token_s: float
    chunk_tokens: int

    def tokens_per_s(self) -> float:
        """Prompt tokens/s of one worker stepping full chunks (its throughput ceiling)."""
        return self.chunk_tokens / (self.base_s + self.token_s * self.chunk_tokens)


@dataclass(frozen=True, slots=True)
class DecodePrice:
    """A decode worker's step cost: ``base_s`` per step plus ``row_s`` per running row."""

    base_s: float
    row_s: float

    def rows_within(self, step_s: float, max_rows: int) -> int:
        """The most rows whose step takes at most ``step_s`` (at least 1, at most
        ``max_rows``)."""
        if self.row_s <= 0:
            return max(1, max_rows)
        fits = math.floor((step_s - self.base_s) / self.row_s + 1e-9)
        return max(1, min(max_rows, fits))

    def tokens_per_s(self, rows: int) -> float:
        """Output tokens/s of one worker running ``rows`` rows (one token each per step)."""
        return rows / (self.base_s + self.row_s * rows)
