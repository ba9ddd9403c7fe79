"""What scripts/bench_serve reads from a running setup's /metrics between points.

The router's placement decisions so far and whether it is idle, and each worker's busy
counters (tandem/loadgen/stats.py turns two reads into a point's activity): plain HTTP GETs
of the pages the processes serve (``--http-port``, ``--metrics-port``).
"""

from __future__ import annotations

import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tandem.launcher.local_cluster import Proc
from tandem.loadgen.stats import decision_counts, worker_counters


def _metrics_text(address: str) -> str:
    """A process's /metrics page at ``address`` (HOST:PORT)."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=30) as reply:
        return reply.read().decode()


def _samples(router: Proc) -> list[Sample]:
    text = _metrics_text(router.info["http"])
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def placement_decisions(router: Proc) -> dict[str, float]:
    """``decision/reason`` -> count, from the router's tandem_disagg_decision_total."""
    return decision_counts(_metrics_text(router.info["http"]))


def worker_reads(procs: dict[str, Proc]) -> dict[str, dict[str, float]]:
    """Each worker's busy counters now (tandem/loadgen/stats.WORKER_COUNTERS), by role."""
    out = {}
    for role in ("prefill", "decode"):
        proc = procs.get(role)
        if proc is None or "metrics" not in proc.info:
            continue
        out[role] = worker_counters(_metrics_text(proc.info["metrics"]))
    return out


def wait_idle(router: Proc, timeout_s: float = 120.0) -> None:
    """Return once the router has no request running or queued (or after ``timeout_s``)."""
    busy = ("tandem_num_requests_running", "tandem_num_requests_waiting")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(s.value for s in _samples(router) if s.name in busy):
            return
        time.sleep(0.5)  # polling a gauge over HTTP: there is nothing to wait on
    print(f"[bench] router still busy after {timeout_s:.0f} s; going on", file=sys.stderr)

