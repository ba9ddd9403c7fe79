"""A worker's Prometheus metrics (DESIGN.md section 5: ``tandem_`` names, ``role`` label),
the same set for both roles (the prefill role adds its push counters in its own module).

    observed as they happen           engine step time (engine thread, via AsyncEngine's
        (histograms + recent windows) ``on_step``), TTFT, ITL, KV transfer seconds and bytes
    read at scrape time               running/waiting requests, KV usage, prefix cache,
        (a collector over a snapshot) preemptions, transfer bytes/failures, leased blocks

The engine and kv_transfer never import prometheus: the snapshot is built from their own
``stats()`` (``update``) right before each scrape (``metrics_http``) and rendered here.
Each ``WorkerMetrics`` owns its registries, so several workers fit in one process. /metrics
renders ``registry``: ``model_name`` on every series and, with compat "vllm", the engine-level
figures also under vLLM's names (``VLLM_ALIASES``; docs/metrics.md). Request-level figures
(TTFT, ITL, E2E, tokens) are aliased by the router only, which sees each request once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tandem.common.obs.metrics_export import COMPAT_VLLM, Aliases, export_registry
from tandem.engine.outputs import EngineStats
from tandem.worker.recent import RecentFigures, RecentWindow

# Engine-level figures whose meaning is vLLM's, per engine as vLLM exports them (docs/metrics.md).
VLLM_ALIASES: Aliases = {
    "tandem_num_requests_running": ("vllm:num_requests_running",),
    "tandem_num_requests_waiting": ("vllm:num_requests_waiting",),
    # vLLM's name since 0.9, and the one it had before (older dashboards, KEDA examples)
    "tandem_kv_cache_usage_ratio": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "tandem_prefix_cache_queries": ("vllm:prefix_cache_queries",),
    "tandem_prefix_cache_hits": ("vllm:prefix_cache_hits",),
    "tandem_num_preemptions": ("vllm:num_preemptions",),
    "tandem_spec_decode_drafts": ("vllm:spec_decode_num_drafts",),
    "tandem_spec_decode_draft_tokens": ("vllm:spec_decode_num_draft_tokens",),
    "tandem_spec_decode_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens",),
}

# Seconds. TTFT/ITL as vLLM buckets them; a step and a push are milliseconds to seconds.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
               0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25,
                0.5, 1.0, 2.5, 5.0, 10.0)
TRANSFER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                    5.0, 10.0, 30.0)


@dataclass(frozen=True, slots=True)
class TransferTotals:
    """The KV transfer's side of a snapshot: bytes moved and failed transfers since start,
    and destination blocks leased to transfers right now."""

    bytes: int = 0
    failures: int = 0
    leased_blocks: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the scrape-time collector renders."""

    engine: EngineStats
    transfer: TransferTotals


class WorkerMetrics:
    """One worker's metrics, labelled ``role`` (prefill or decode): ``instruments`` (tandem_*
    names) and ``registry`` (what /metrics renders: ``model_name`` on every series, vLLM's
    aliases with compat "vllm")."""

    def __init__(
        self, role: str, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
        *, model_name: str = "", compat: str = COMPAT_VLLM,
    ) -> None:
        self.role = role
        self.instruments = CollectorRegistry(auto_describe=True)
        reg = self.instruments
        self.registry = export_registry(reg, model_name, compat, VLLM_ALIASES)
        self._step = Histogram(
            "tandem_engine_step_seconds", "Wall time of one engine step (schedule, forward, "
            "sample)", ["role"], buckets=STEP_BUCKETS, registry=reg).labels(role)
        self._ttft = Histogram(
            "tandem_time_to_first_token_seconds", "Request arrival on this worker to its first "
            "sampled token", ["role"], buckets=TTFT_BUCKETS, registry=reg).labels(role)
        self._itl = Histogram(
            "tandem_inter_token_latency_seconds", "Gap between a request's successive outputs",
            ["role"], buckets=ITL_BUCKETS, registry=reg).labels(role)
        self._transfer = Histogram(
            "tandem_kv_transfer_seconds", "Duration of committed KV transfers (first frame "
            "to commit)", ["role"], buckets=TRANSFER_BUCKETS, registry=reg).labels(role)
        self._recent_ttft = RecentWindow(window_s, clock=clock)
        self._recent_itl = RecentWindow(window_s, clock=clock)
        self._recent_bytes = RecentWindow(window_s, clock=clock)
        self.snapshot: Snapshot | None = None
        # a decode worker borrowing its prefill worker's cores: steps that did (core_lending)
        self.borrowed_steps: Callable[[], int] | None = None
        reg.register(_SnapshotCollector(self))

    # -- observed as they happen ------------------------------------------------------------
    def observe_step(self, seconds: float) -> None:
        """One engine step took ``seconds`` (called on the engine thread: thread-safe)."""
        self._step.observe(seconds)

    def first_token(self, seconds: float) -> None:
        """A request's first token came ``seconds`` after it arrived here."""
        self._ttft.observe(seconds)
        self._recent_ttft.add(seconds)

    def inter_token(self, seconds: float) -> None:
        """A request's next output came ``seconds`` after its previous one."""
        self._itl.observe(seconds)
        self._recent_itl.add(seconds)

    def transfer_committed(self, nbytes: int, seconds: float) -> None:
        """A KV transfer of ``nbytes`` committed after ``seconds``."""
        self._transfer.observe(seconds)
        self._recent_bytes.add(nbytes)

    # -- read at scrape time ----------------------------------------------------------------
    def update(self, engine: EngineStats, transfer: TransferTotals) -> None:
        """Take the figures the next scrape renders."""
        self.snapshot = Snapshot(engine, transfer)

    def recent(self) -> RecentFigures:
        """Percentiles and the transfer rate of the recent window (for the Stats RPC)."""
        return RecentFigures(
            ttft_p50_s=self._recent_ttft.percentile(50),
            ttft_p90_s=self._recent_ttft.percentile(90),
            itl_p50_s=self._recent_itl.percentile(50),
            itl_p90_s=self._recent_itl.percentile(90),
            kv_transfer_bytes_per_s=self._recent_bytes.rate(),
        )


class _SnapshotCollector(Collector):
    """Renders the latest ``Snapshot`` (nothing before the first ``update``)."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        snap = self._metrics.snapshot
        if snap is None:
            return
        role = self._metrics.role
        e, t = snap.engine, snap.transfer

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=["role"])
            family.add_metric([role], value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=["role"])
            family.add_metric([role], value)
            return family

        yield gauge("tandem_num_requests_running", "Requests in the engine's running batch",
                    e.num_running)
        yield gauge("tandem_num_requests_waiting", "Requests queued in the engine",
                    e.num_waiting)
        yield gauge("tandem_num_requests_waiting_for_kv", "Reservations waiting for their KV "
                    "from a prefill worker", e.num_waiting_for_remote_kv)
        yield gauge("tandem_kv_cache_usage_ratio", "Fraction of KV blocks in use", e.kv_cache_usage)
        yield gauge("tandem_kv_cache_blocks", "KV blocks in the cache", e.num_blocks)
        yield counter("tandem_prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                      e.prefix_cache_queries)
        yield counter("tandem_prefix_cache_hits", "Prompt tokens found in the prefix cache",
                      e.prefix_cache_hits)
        yield counter("tandem_num_preemptions", "Requests preempted (to be recomputed)",
                      e.num_preemptions)
        yield counter("tandem_engine_steps", "Engine steps that ran the model", e.num_steps)
        yield counter("tandem_generation_tokens", "Tokens sampled by the engine",
                      e.num_generated_tokens)
        yield counter("tandem_kv_transfer_bytes", "KV bytes pushed (prefill) or received "
                      "(decode)", t.bytes)
        yield counter("tandem_kv_transfer_failures", "KV transfers that ended without a commit "
                      "(aborted, failed or expired)", t.failures)
        yield gauge("tandem_kv_leased_blocks", "KV blocks leased to transfers in flight "
                    "(decode: reserved for a push; prefill: being pushed)", t.leased_blocks)
        yield gauge("tandem_kv_stranded_blocks", "KV blocks in use that no running, waiting, "
                    "reserved or held request accounts for (a leak: always 0)",
                    e.num_stranded_blocks)
        yield counter("tandem_spec_decode_drafts", "Speculative drafts verified (one per "
                      "request and step)", e.spec_num_steps)
        yield counter("tandem_spec_decode_draft_tokens", "Draft tokens proposed and verified",
                      e.spec_proposed_tokens)
        yield counter("tandem_spec_decode_accepted_tokens", "Draft tokens the target accepted",
                      e.spec_accepted_tokens)
        if self._metrics.borrowed_steps is not None:
            yield counter("tandem_core_share_borrowed_steps", "Engine steps run on the cores "
                          "the idle prefill worker on this host lent",
                          self._metrics.borrowed_steps())
