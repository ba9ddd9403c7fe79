"""The router's Prometheus metrics (DESIGN.md section 5: ``tandem_`` names, ``role="router"``).

Two kinds of figures:

    observed on the request path   requests by outcome and finish reason, TTFT, ITL, TPOT,
        (Frontend calls ``RouterMetrics`` E2E, queue time, tokens
        at each phase boundary)
    read at scrape time            fallbacks and migrations (HandoffCounters), running and
        (a custom collector)       queued requests (AdmissionLedger), the worker pool (Registry)

Each ``RouterMetrics`` owns its own registries (never the process-wide default), so several
routers can live in one test process. ``/metrics`` renders ``metrics.registry``: every family
labelled ``model_name``, and with compat "vllm" the request-level figures also under vLLM's
names (``VLLM_ALIASES``, tandem/common/obs/metrics_export.py, docs/metrics.md). The engine-level ones
(running/waiting batches, KV cache, prefix cache) are the workers' (tandem/worker/metrics.py).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from tandem.common.obs.metrics_export import COMPAT_VLLM, Aliases, export_registry
from tandem.placement.slo import ITL_BUCKETS, TTFT_BUCKETS
from tandem.placement.worker_view import Role
from tandem.router.admission import AdmissionLedger
from tandem.router.errors import (
    DeadlineError,
    DrainingError,
    InvalidRequestError,
    NoWorkerError,
    OverloadedError,
    WorkerCallError,
    WorkerFailedError,
)
from tandem.router.handoff.counters import HandoffCounters
from tandem.router.handoff.counters import Histogram as Counts
from tandem.router.membership.registry import Registry

ROLE = "router"
OUTCOMES = ("ok", "invalid", "overloaded", "unavailable", "deadline", "cancelled", "error")
# How requests ended, as vLLM's ``finished_reason`` names it: "stop" (an EOS, stop string or
# stop token; tool calls too), "length" (max_tokens or the context), "abort" (the client went).
FINISH_REASONS = ("stop", "length", "abort")

# TTFT and ITL buckets: tandem/placement/slo.py (the latency grid SLO targets sit on, which
# the planner's simulator tallies into too).
# Tokens per finished request, after vLLM's request_generation_tokens (1-2-5 steps).
LENGTH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000,
                  100000)
# End-to-end latency in seconds, after vLLM's.
E2E_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0,
               20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)

# Request-level figures whose meaning is vLLM's (docs/metrics.md): what a client sees, once per
# request, measured where vLLM's API server measures it (arrival to first token sent, ...).
VLLM_ALIASES: Aliases = {
    "tandem_time_to_first_token_seconds": ("vllm:time_to_first_token_seconds",),
    # vLLM observes one gap per engine output, as this does per streamed chunk; it exported
    # the same histogram as time_per_output_token_seconds before renaming it.
    "tandem_inter_token_latency_seconds": ("vllm:inter_token_latency_seconds",
                                           "vllm:time_per_output_token_seconds"),
    "tandem_e2e_request_latency_seconds": ("vllm:e2e_request_latency_seconds",),
    "tandem_prompt_tokens": ("vllm:prompt_tokens",),
    "tandem_generation_tokens": ("vllm:generation_tokens",),
    "tandem_requests_finished": ("vllm:request_success",),
}

# HandoffCounters field -> the fallback ``kind`` label it is exported under.
FALLBACK_KINDS = {
    "prefill_retries": "prefill_retry",
    "local_prefill_fallbacks": "local_prefill_fallback",
    "local_prefill_short": "local_prefill_short",
    "local_prefill_colocated": "local_prefill_colocated",
    "local_prefill_placed": "local_prefill_placed",
    "reserve_retries": "reserve_retry",
}

# A worker's status code -> outcome, following what the client is told (tandem/router/status.py:
# a worker's internal trouble reaches the client as UNAVAILABLE).
_CODE_OUTCOMES = {
    "INVALID_ARGUMENT": "invalid",
    "OUT_OF_RANGE": "invalid",
    "RESOURCE_EXHAUSTED": "overloaded",
    "DEADLINE_EXCEEDED": "deadline",
    "UNAVAILABLE": "unavailable",
    "ABORTED": "unavailable",
    "INTERNAL": "unavailable",
    "UNKNOWN": "unavailable",
    "CANCELLED": "unavailable",
}


def outcome_of(exc: BaseException) -> str:
    """How a request that raised ``exc`` ended, as a ``tandem_requests_total`` outcome."""
    if isinstance(exc, InvalidRequestError):
        return "invalid"
    if isinstance(exc, OverloadedError):
        return "overloaded"
    if isinstance(exc, (NoWorkerError, DrainingError)):
        return "unavailable"
    if isinstance(exc, DeadlineError):
        return "deadline"
    if isinstance(exc, (WorkerFailedError, WorkerCallError)):
        return _CODE_OUTCOMES.get(exc.code_name, "error")
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        return "cancelled"
    return "error"


class _StateCollector(Collector):
    """Scrape-time view of counters and gauges the router already keeps elsewhere."""

    def __init__(
        self, counters: HandoffCounters, ledger: AdmissionLedger, registry: Registry
    ) -> None:
        self._counters = counters
        self._ledger = ledger
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        c = self._counters
        fallbacks = CounterMetricFamily(
            "tandem_handoff_fallbacks", "Detours the handoff took, by kind",
            labels=["role", "kind"])
        for field, kind in FALLBACK_KINDS.items():
            fallbacks.add_metric([ROLE, kind], getattr(c, field))
        yield fallbacks
        decisions = CounterMetricFamily(
            "tandem_disagg_decision", "Where prompts were prefilled (remote: a prefill "
            "worker; local: the decode worker) and why", labels=["role", "decision", "reason"])
        for (decision, reason), n in sorted(c.decisions.items()):
            decisions.add_metric([ROLE, decision, reason], n)
        yield decisions
        yield _counter("tandem_migrations", "Requests moved to another decode worker "
                       "after theirs was lost (before or after the first token)", c.migrations)
        moves = CounterMetricFamily(
            "tandem_live_migrations", "Decode streams asked to move live to another decode "
            "worker, by cause and outcome (moved, or stayed where they were)",
            labels=["role", "cause", "outcome"])
        for (cause, outcome), n in sorted(c.live_moves.items()):
            moves.add_metric([ROLE, cause, outcome], n)
        yield moves
        yield _counter("tandem_live_migration_bytes", "KV bytes pushed by live moves once "
                       "their streams stopped (the stop-and-copy)", c.moved_bytes)
        yield _counter("tandem_live_migration_precopy_bytes", "KV bytes pushed by live "
                       "moves' pre-copies, while their streams decoded on", c.precopy_bytes)
        yield _histogram("tandem_live_migration_gap_seconds", "A live move's client-visible "
                         "gap: the last token from the old decode worker to the first from "
                         "the new one", c.move_gap)
        yield _histogram("tandem_live_migration_gap_steps", "That gap over the old decode "
                         "worker's recent step (the stream's mean token spacing there)",
                         c.move_gap_steps)
        yield _counter("tandem_worker_aborts_sent", "Abort RPCs sent to workers",
                       c.aborts_sent)
        yield _gauge("tandem_num_requests_running", "Requests admitted and in flight",
                     self._ledger.running)
        yield _gauge("tandem_num_requests_waiting", "Requests queued for admission",
                     self._ledger.waiting)
        pool = GaugeMetricFamily(
            "tandem_workers", "Known workers by their role and whether they are routable "
            "(healthy and not draining)", labels=["role", "worker_role", "routable"])
        for worker_role in Role:
            known = sum(
                1 for e in self._registry.endpoints()
                if self._registry.role_of(e) is worker_role
            )
            routable = len(self._registry.routable(worker_role))
            pool.add_metric([ROLE, worker_role.value, "true"], routable)
            pool.add_metric([ROLE, worker_role.value, "false"], known - routable)
        yield pool
        loras = GaugeMetricFamily(
            "tandem_lora_adapter_workers", "Routable workers serving each LoRA adapter (by "
            "its name; what a request naming it may be routed to)",
            labels=["role", "worker_role", "adapter"])
        for worker_role in Role:
            held = collections.Counter(i.rpartition("@")[0] for w in self._registry.routable(worker_role)
                           for i in w.loras)
            for name, n in sorted(held.items()):
                loras.add_metric([ROLE, worker_role.value, name], n)
        yield loras


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=["role"])
    family.add_metric([ROLE], value)
    return family


def _histogram(name: str, doc: str, counts: Counts) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=["role"])
    cumulative, buckets = 0, []
    for bound, n in zip((*counts.bounds, float("inf")), counts.counts, strict=True):
        cumulative += n
        buckets.append((floatToGoString(bound), cumulative))
    family.add_metric([ROLE], buckets, counts.total)
    return family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["role"])
    family.add_metric([ROLE], value)
    return family


class RouterMetrics:
    """Every metric one router exports: ``instruments`` (tandem_* names) and ``registry``
    (what /metrics renders: ``model_name`` on every series, vLLM's aliases with compat
    "vllm")."""

    def __init__(
        self, counters: HandoffCounters, ledger: AdmissionLedger, registry: Registry,
        model_name: str = "", compat: str = COMPAT_VLLM,
    ) -> None:
        self.instruments = CollectorRegistry(auto_describe=True)
        reg = self.instruments
        self.registry = export_registry(reg, model_name, compat, VLLM_ALIASES)
        self.requests = Counter(
            "tandem_requests", "Generate requests by how they ended", ["role", "outcome"],
            registry=reg)
        for outcome in OUTCOMES:  # every outcome exists from the start, at 0
            self.requests.labels(ROLE, outcome)
        self.finish_reasons = Counter(
            "tandem_requests_finished", "Requests that ended with a finish reason (stop, "
            "length; abort: the client went away)", ["role", "finished_reason"], registry=reg)
        for reason in FINISH_REASONS:
            self.finish_reasons.labels(ROLE, reason)
        self.ttft = Histogram(
            "tandem_time_to_first_token_seconds", "Arrival to first token sent", ["role"],
            buckets=TTFT_BUCKETS, registry=reg).labels(ROLE)
        self.itl = Histogram(
            "tandem_inter_token_latency_seconds", "Gap between successive token chunks",
            ["role"], buckets=ITL_BUCKETS, registry=reg).labels(ROLE)
        self.tpot = Histogram(
            "tandem_time_per_output_token_seconds", "Per finished request of two or more "
            "tokens: first token to last, over the tokens after the first", ["role"],
            buckets=ITL_BUCKETS, registry=reg).labels(ROLE)
        self.e2e = Histogram(
            "tandem_e2e_request_latency_seconds", "Arrival to last token, finished requests",
            ["role"], buckets=E2E_BUCKETS, registry=reg).labels(ROLE)
        self.queue_time = Histogram(
            "tandem_request_queue_time_seconds", "Time waiting for admission", ["role"],
            buckets=TTFT_BUCKETS, registry=reg).labels(ROLE)
        self.prompt_tokens = Counter(
            "tandem_prompt_tokens", "Prompt tokens of admitted requests", ["role"],
            registry=reg).labels(ROLE)
        self.request_generation_tokens = Histogram(
            "tandem_request_generation_tokens", "Tokens streamed per finished request",
            ["role"], buckets=LENGTH_BUCKETS, registry=reg).labels(ROLE)
        self.generation_tokens = Counter(
            "tandem_generation_tokens", "Tokens streamed to clients", ["role"],
            registry=reg).labels(ROLE)
        reg.register(_StateCollector(counters, ledger, registry))

    def finished(self, outcome: str) -> None:
        """Count one request's end (``outcome`` is one of OUTCOMES); a cancelled one is also
        an "abort" finish."""
        self.requests.labels(ROLE, outcome).inc()
        if outcome == "cancelled":
            self.finish_reasons.labels(ROLE, "abort").inc()

    def succeeded(self, finish_reason: str) -> None:
        """Count a request that finished normally, with the engine's (or OpenAI's) reason."""
        self.requests.labels(ROLE, "ok").inc()
        reason = "stop" if finish_reason in ("", "tool_calls") else finish_reason
        self.finish_reasons.labels(ROLE, reason).inc()

    def failed(self, exc: BaseException) -> None:
        """Count a request that ended by raising ``exc``."""
        self.finished(outcome_of(exc))
