"""The router's line in ``tandem top``: read from its Prometheus ``/metrics`` endpoint.

Latency percentiles come from the router's histograms (since the router started), estimated
the way Prometheus' ``histogram_quantile`` does (tandem/common/obs/histogram.py).
"""

from __future__ import annotations

import math
import ssl
import urllib.request
from dataclasses import dataclass, field

from tandem.common.obs.histogram import histogram_quantile

TTFT = "tandem_time_to_first_token_seconds"
ITL = "tandem_inter_token_latency_seconds"


@dataclass(frozen=True, slots=True)
class RouterFigures:
    """What the router line shows."""

    running: float = 0.0
    waiting: float = 0.0
    outcomes: dict[str, float] = field(default_factory=dict)
    ttft_p50_s: float = math.nan
    ttft_p90_s: float = math.nan
    itl_p50_s: float = math.nan
    itl_p90_s: float = math.nan


def parse_router_metrics(text: str) -> RouterFigures:
    """RouterFigures from the router's Prometheus text (missing metrics stay empty/NaN)."""
    # Here, not at the top: `tandem top` without --router-http needs no prometheus-client
    # (an optional package of the tandem-client distribution).
    from prometheus_client.parser import text_string_to_metric_families

    buckets: dict[str, list[tuple[float, float]]] = {TTFT: [], ITL: []}
    outcomes: dict[str, float] = {}
    gauges = {"tandem_num_requests_running": 0.0, "tandem_num_requests_waiting": 0.0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("role", "router") != "router":
                continue
            if s.name.endswith("_bucket") and s.name[: -len("_bucket")] in buckets:
                buckets[s.name[: -len("_bucket")]].append((float(s.labels["le"]), s.value))
            elif s.name == "tandem_requests_total":
                outcomes[s.labels.get("outcome", "?")] = s.value
            elif s.name in gauges:
                gauges[s.name] = s.value
    return RouterFigures(
        running=gauges["tandem_num_requests_running"],
        waiting=gauges["tandem_num_requests_waiting"],
        outcomes=outcomes,
        ttft_p50_s=histogram_quantile(buckets[TTFT], 0.5),
        ttft_p90_s=histogram_quantile(buckets[TTFT], 0.9),
        itl_p50_s=histogram_quantile(buckets[ITL], 0.5),
        itl_p90_s=histogram_quantile(buckets[ITL], 0.9),
    )


def _ms(s: float) -> str:
    return "-" if math.isnan(s) else f"{s * 1e3:.0f}"


def render_router(address: str, f: RouterFigures) -> str:
    """One line: load, outcomes, and latency percentiles since the router started."""
    done = ", ".join(f"{k} {v:.0f}" for k, v in sorted(f.outcomes.items()) if v)
    return (f"router {address}: running {f.running:.0f}, waiting {f.waiting:.0f}; "
            f"requests: {done or 'none yet'}; TTFT p50/p90 {_ms(f.ttft_p50_s)}/"
            f"{_ms(f.ttft_p90_s)} ms, ITL p50/p90 {_ms(f.itl_p50_s)}/{_ms(f.itl_p90_s)} ms "
            "(since start)")


def fetch_metrics(address: str, ca_cert: str | None = None, timeout_s: float = 5.0) -> str:
    """GET ``/metrics`` from ``address`` (``host:port`` or an http(s) URL)."""
    url = address if "://" in address else f"http://{address}"
    url = url.rstrip("/") + ("" if url.endswith("/metrics") else "/metrics")
    context = ssl.create_default_context(cafile=ca_cert) if url.startswith("https") else None
    with urllib.request.urlopen(url, timeout=timeout_s, context=context) as reply:
        return reply.read().decode()
