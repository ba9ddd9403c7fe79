"""Cumulative histograms as Prometheus exposes them: quantiles and differences.

A histogram is a sequence of ``(upper bound, cumulative count)`` pairs, the last bound
``+Inf`` (a ``_bucket`` series by its ``le`` label). Two readings of the same histogram give
the observations between them (``histogram_delta``: what Prometheus' ``increase`` does per
bucket), and a quantile is estimated the way ``histogram_quantile`` does: linear
interpolation inside the bucket that holds the rank. Used by ``tandem top`` (since the
router started) and the autoscaler (over its window).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Buckets = tuple[tuple[float, float], ...]


def histogram_quantile(buckets: Sequence[tuple[float, float]], q: float) -> float:
    """The ``q`` quantile (0..1) of a histogram given as (upper bound, cumulative count)
    pairs; NaN when it holds no observation. The +Inf bucket answers with the last finite
    bound (as Prometheus does)."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return math.nan
    rank = q * ordered[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            share = (rank - lower_count) / (count - lower_count)
            return lower_bound + (bound - lower_bound) * share
        lower_bound, lower_count = bound, count
    return lower_bound


def histogram_delta(old: Buckets | None, new: Buckets) -> Buckets:
    """The observations ``new`` holds beyond ``old`` (two readings of one histogram).

    ``new`` itself when there is nothing to subtract: no earlier reading, other bounds, or a
    reset (the process restarted: its total went down), as Prometheus' ``increase`` counts
    a reset from zero."""
    if (old is None or len(old) != len(new) or new[-1][1] < old[-1][1]
            or any(a[0] != b[0] for a, b in zip(old, new, strict=True))):
        return new
    return tuple((bound, max(0.0, count - before))
                 for (bound, count), (_, before) in zip(new, old, strict=True))
