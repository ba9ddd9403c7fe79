"""What the router knows of a worker's prompt queue: its last report, or its own count.

A real router reads a worker's ``queued_prefill_tokens`` from the worker's last report (the
Heartbeat every ``heartbeat_interval_s`` and the health monitor's Stats every
``health_interval_s``, 2 s each by default: tandem/router/config.py) and from its own count of the
prefills it has running there, whichever is larger (tandem/router/membership/registry.py,
``_view``): the report is a beat old, the count exact but only this router's. So after a
long prompt leaves a worker's queue the router still sees it there until the next report.
Measured on a 2-core CPU box, the real router at a RAG/chat mix of 0.8 req/s saw a median
of 845 queued tokens on the prefill worker for its chat-sized prompts (the worker 57% busy)
where a simulated router reading the exact queue saw none.

:class:`ReportedQueue` gives a simulated worker the same view. Its reports come every
``interval_s`` seconds of simulated time, at whole multiples of it (``ClusterSpec``'s
``report_interval_s``: 2 s, the health probe's, by default); the simulator's single
router's own count is the exact queue. ``interval_s = 0``: every report is current (the
simulator before this).

The worker calls :meth:`before_change` with the queue as it is, before every change to it,
and :meth:`seen` for what the router reads: a report boundary passed since the last change
took the queue as it was over that stretch, so no event per report is needed.
"""

from __future__ import annotations

import math


class ReportedQueue:
    """One worker's queued prompt tokens as its router sees them (see the module docstring)."""

    __slots__ = ("interval_s", "reported", "reported_at")

    def __init__(self, interval_s: float) -> None:
        if interval_s < 0:
            raise ValueError(f"a report interval must be >= 0, not {interval_s}")
        self.interval_s = interval_s
        self.reported = 0  # the queue at the last report
        self.reported_at = -math.inf  # that report's time

    def before_change(self, queued: int, now: float) -> None:
        """The queue, ``queued`` tokens since its last change, changes at ``now``: a
        report at or before ``now`` and after the last one read it."""
        interval = self.interval_s
        if interval <= 0:
            return
        boundary = math.floor(now / interval) * interval
        if boundary > self.reported_at:
            self.reported, self.reported_at = queued, boundary

    def seen(self, queued: int, now: float) -> int:
        """What the router reads at ``now`` of a queue of ``queued`` tokens: the last
        report's figure or the exact one, whichever is larger."""
        if self.interval_s <= 0:
            return queued
        self.before_change(queued, now)
        return self.reported if self.reported > queued else queued
