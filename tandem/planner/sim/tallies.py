"""What the simulated router counts as it goes: tandem/router/metrics.py's figures, cumulative.

    arrive         requests admitted, their prompt tokens  (tandem_request_queue_time_seconds
                                                            _count, tandem_prompt_tokens_total)
    first token    arrival -> first token, per request     (tandem_time_to_first_token_seconds)
                   one token to the client per leg
    finished       requests finished, their tokens and     (tandem_request_generation_tokens,
                   TPOT (two tokens or more)                tandem_time_per_output_token_...)

The histograms use the router's own bucket bounds (tandem/placement/slo.py), so a controller reading them in the
simulator estimates percentiles with the resolution it has in a cluster. Tokens the decode
workers stream are theirs to count (DecodeWorker.tokens_streamed).
"""

from __future__ import annotations

from bisect import bisect_left

from tandem.placement.slo import ITL_BUCKETS, TTFT_BUCKETS

Buckets = tuple[tuple[float, float], ...]


class Histogram:
    """Observations counted into fixed upper bounds (``le``), plus +Inf."""

    __slots__ = ("bounds", "counts")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)

    def observe(self, value: float) -> None:
        """Count one observation (in the first bucket whose bound is >= ``value``)."""
        self.counts[bisect_left(self.bounds, value)] += 1

    def cumulative(self) -> Buckets:
        """(upper bound, cumulative count) pairs, the last bound +Inf (Prometheus' shape)."""
        out, total = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, float(total)))
        return tuple(out)


class RouterTallies:
    """The simulated router's cumulative counters and histograms."""

    __slots__ = ("ttft", "tpot", "prompt_tokens", "first_tokens", "admitted", "finished",
                 "finished_tokens")

    def __init__(self) -> None:
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(ITL_BUCKETS)
        self.prompt_tokens = 0
        self.first_tokens = 0  # legs' first tokens (the rest are the decode workers')
        self.admitted = 0
        self.finished = 0
        self.finished_tokens = 0
