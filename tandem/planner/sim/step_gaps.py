"""The longest step a simulated decode batch ran since any given step: a row's worst token gap.

A row that joined the batch at step ``j`` and leaves at step ``n`` saw one token a step, so
its largest inter-token gap is the longest step among ``j .. n - 1``. The decode worker
(tandem/planner/sim/decode.py) records each step boundary's last step here and asks, when a
row leaves, for the longest step since it joined. Kept as suffix maxima::

    steps:   (3, 0.02)  (7, 0.05)  (9, 0.03)  (12, 0.01)     (last step, its length)
    kept:               (7, 0.05)  (9, 0.03)  (12, 0.01)     lengths strictly falling

A new step drops every kept entry no longer than itself (none of them can be a later
maximum), so a record is amortized O(1) and a query one binary search.
"""

from __future__ import annotations

from bisect import bisect_left


class StepGaps:
    """Suffix maxima of a batch's step lengths, by the step each run of steps ended on."""

    __slots__ = ("_steps", "_lengths")

    def __init__(self) -> None:
        self._steps: list[int] = []  # the last step of each kept entry, rising
        self._lengths: list[float] = []  # its length in seconds, strictly falling

    def record(self, step: int, length_s: float) -> None:
        """Steps up to ``step`` (after every step recorded before) lasted at most
        ``length_s``, the last of them exactly that long."""
        steps, lengths = self._steps, self._lengths
        while lengths and lengths[-1] <= length_s:
            lengths.pop()
            steps.pop()
        steps.append(step)
        lengths.append(length_s)

    def longest_since(self, step: int) -> float | None:
        """The longest step recorded from ``step`` on; None: none recorded since."""
        i = bisect_left(self._steps, step)
        return self._lengths[i] if i < len(self._lengths) else None
