"""The service-level targets requests are kept inside, and the latency buckets they are read in.

``Slo`` is what placement decides against (cost_model.decide: a request's predicted TTFT and
the decode token gap it imposes), what the planner sizes a cluster for and what the autoscaler
holds. The buckets are the router's TTFT and inter-token latency histograms' edges
(tandem/router/metrics.py exports them); the planner's simulator tallies into the same edges so
its percentiles read like a served run's, and the Helm chart's SLO values are chosen among them.
"""

from __future__ import annotations

from dataclasses import dataclass

# Latency buckets in seconds, after vLLM's (TTFT and ITL of LLM requests). TTFT adds 1.5, 2
# and 3 s, where TTFT targets sit: the autoscaler's p90 interpolates inside a bucket, 1 .. 2.5 s
# is too wide a guess around a 2 s target, and an SLO alert counts requests inside the default
# --slo-ttft-s (le="2.0").
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5,
                2.0, 2.5, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
               0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


@dataclass(frozen=True, slots=True)
class Slo:
    """The targets placement keeps requests inside (seconds)."""

    ttft_s: float
    tpot_s: float
