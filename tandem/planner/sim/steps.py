"""The closed form of k back-to-back decode steps over an unchanged batch.

R rows at context C0 make step i (from 0) last ``first + growth x i`` seconds, with
``first = base + per_row R + per_ctx C0`` and ``growth = per_ctx R`` (every row's context
grows by one a step), so k steps take::

    span(k) = k first + growth k (k - 1) / 2

and the first step boundary at or after ``delta`` seconds is the smallest k with
span(k) >= delta: the positive root of that quadratic, rounded up (then nudged by whole
steps so floating point never disagrees with ``span`` itself).
"""

from __future__ import annotations

import math


def span(k: int, first: float, growth: float) -> float:
    """Seconds of ``k`` steps, the first ``first`` long, each next ``growth`` longer."""
    return k * first + growth * k * (k - 1) / 2


def boundary_after(delta: float, first: float, growth: float) -> int | None:
    """The fewest steps (>= 1) whose span reaches ``delta``; None when steps take no time."""
    if first <= 0 and growth <= 0:
        return None
    a = growth / 2
    b = first - a
    k = math.ceil((math.sqrt(b * b + 4 * a * delta) - b) / (2 * a) if a > 0 else delta / first)
    k = max(k, 1)
    while k > 1 and span(k - 1, first, growth) >= delta:
        k -= 1
    while span(k, first, growth) < delta:
        k += 1
    return k


def steps_by(delta: float, first: float, growth: float, most: int) -> int:
    """Steps completed within ``delta`` seconds (at most ``most``)."""
    k = boundary_after(delta, first, growth)
    if k is None:
        return most
    return min(k if span(k, first, growth) <= delta else k - 1, most)
