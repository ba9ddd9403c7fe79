"""The router's Prometheus metrics: outcome mapping, scrape-time state, and what traffic moves
(a real RouterServer in front of fake workers, scraped through its own registry)."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from prometheus_client import generate_latest

from tandem.placement.worker_view import Role
from tandem.protos.v1 import tandem_pb2
from tandem.router.admission import AdmissionLedger
from tandem.router.cost import Cost
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
from tandem.router.membership.registry import Registry
from tandem.router.metrics import OUTCOMES, RouterMetrics, outcome_of
from tandem.router.tokenizer import RouterTokenizer
from tests.scrape import Samples, parse, value
from tests.unit.router.harness import Cluster, cluster, until

PROMPT = list(range(1000, 1040))
# A client deadline long enough that the request reaches its decode leg well before it on a
# loaded machine (the test waits for that leg to hang before the deadline may pass).
DEADLINE_S = 2.0


@pytest.mark.parametrize("exc,outcome", [
    (InvalidRequestError("prompt", "empty"), "invalid"),
    (OverloadedError("full", 100), "overloaded"),
    (NoWorkerError("none"), "unavailable"),
    (DrainingError("draining"), "unavailable"),
    (DeadlineError("late"), "deadline"),
    (asyncio.CancelledError(), "cancelled"),
    (GeneratorExit(), "cancelled"),
    (WorkerFailedError("bad sampling", "INVALID_ARGUMENT"), "invalid"),
    (WorkerFailedError("no prefill succeeded"), "unavailable"),
    (WorkerCallError("h:1", "Reserve", "RESOURCE_EXHAUSTED", "full"), "overloaded"),
    (WorkerCallError("h:1", "Prefill", "INTERNAL", "boom"), "unavailable"),
    (WorkerFailedError("odd", "PERMISSION_DENIED"), "error"),
    (RuntimeError("bug"), "error"),
])
def test_outcome_of(exc: BaseException, outcome: str) -> None:
    assert outcome_of(exc) == outcome
    assert outcome in OUTCOMES


def _scrape(metrics: RouterMetrics) -> Samples:
    return parse(generate_latest(metrics.registry).decode())


def test_scrape_reads_counters_ledger_and_pool() -> None:
    counters, ledger = HandoffCounters(), AdmissionLedger(4, 8, 100)
    registry = Registry(time.monotonic, 1.0)
    for i in range(3):
        registry.add_static(Role.DECODE, f"127.0.0.1:{100 + i}")
    registry.add_static(Role.PREFILL, "127.0.0.1:200")
    registry.set_healthy("127.0.0.1:101", False)
    metrics = RouterMetrics(counters, ledger, registry)
    second = RouterMetrics(HandoffCounters(), ledger, registry)  # its own registry: no clash

    s = _scrape(metrics)
    assert value(s, "tandem_migrations_total", role="router") == 0
    assert all(value(s, "tandem_requests_total", outcome=o) == 0 for o in OUTCOMES)

    counters.migrations, counters.prefill_retries, counters.local_prefill_colocated = 2, 3, 5
    counters.aborts_sent = 7
    ledger.start(Cost(2, 30))  # a prompt forked into 2 sequences: 2 running
    ledger.enqueue(Cost(1, 5))
    s = _scrape(metrics)
    assert value(s, "tandem_migrations_total", role="router") == 2
    assert value(s, "tandem_handoff_fallbacks_total", kind="prefill_retry") == 3
    assert value(s, "tandem_handoff_fallbacks_total", kind="local_prefill_colocated") == 5
    assert value(s, "tandem_handoff_fallbacks_total", kind="reserve_retry") == 0
    assert value(s, "tandem_worker_aborts_sent_total") == 7
    assert value(s, "tandem_num_requests_running", role="router") == 2
    assert value(s, "tandem_num_requests_waiting", role="router") == 1
    assert value(s, "tandem_workers", worker_role="decode", routable="true") == 2
    assert value(s, "tandem_workers", worker_role="decode", routable="false") == 1
    assert value(s, "tandem_workers", worker_role="prefill", routable="true") == 1
    assert value(_scrape(second), "tandem_migrations_total") == 0


def _request(n: int = 6, rid: str = "r1") -> tandem_pb2.GenerateRequest:
    return tandem_pb2.GenerateRequest(
        request_id=rid,
        token_ids=tandem_pb2.TokenIds(ids=PROMPT),
        sampling=tandem_pb2.SamplingParams(max_tokens=n, temperature=0.0),
    )


def _outcome(c: Cluster, outcome: str) -> float:
    return value(_scrape(c.router.metrics), "tandem_requests_total", outcome=outcome)


def test_traffic_moves_histograms_counters_and_outcomes(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, n_decode=2) as c:
            metrics = c.router.metrics
            first = c.first_decode(len(PROMPT) + 10)
            c.decode[first].die_after = 3  # the policy's first pick: migrates once
            responses = await c.generate(_request(n=10))
            responses += await c.generate(_request(n=4, rid="r2"))
            sent = sum(len(r.token_ids) for r in responses)
            s = _scrape(metrics)
            assert value(s, "tandem_requests_total", outcome="ok") == 2
            assert value(s, "tandem_time_to_first_token_seconds_count") == 2
            assert value(s, "tandem_e2e_request_latency_seconds_count") == 2
            assert value(s, "tandem_request_queue_time_seconds_count") == 2
            # Every chunk carries one token: a gap before each but the first of a request.
            assert value(s, "tandem_inter_token_latency_seconds_count") == sent - 2
            assert value(s, "tandem_time_to_first_token_seconds_sum") > 0
            # One TPOT per finished request of two or more tokens (the autoscaler's signal).
            assert value(s, "tandem_time_per_output_token_seconds_count") == 2
            assert value(s, "tandem_time_per_output_token_seconds_sum") > 0
            assert value(s, "tandem_request_generation_tokens_count") == 2
            assert value(s, "tandem_request_generation_tokens_sum") == sent
            assert value(s, "tandem_prompt_tokens_total") == 2 * len(PROMPT)
            assert value(s, "tandem_generation_tokens_total") == sent >= 14
            assert value(s, "tandem_migrations_total") == 1
            assert value(s, "tandem_num_requests_running", role="router") == 0
            assert value(s, "tandem_workers", worker_role="decode", routable="true") == 1

            with pytest.raises(grpc.aio.AioRpcError):  # invalid: counted at prepare
                await c.generate(tandem_pb2.GenerateRequest(model="other", text="hi"))
            assert _outcome(c, "invalid") == 1

            other = 1 - first
            c.decode[other].hang_after = 0
            late = c.stub.Generate(_request(rid="r3"), timeout=DEADLINE_S)
            await asyncio.wait_for(c.decode[other].hanging.wait(), DEADLINE_S)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in late:
                    pass
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await until(lambda: _outcome(c, "deadline") == 1)

            call = c.stub.Generate(_request(rid="r4"))
            await call.read()
            s = _scrape(metrics)
            assert value(s, "tandem_num_requests_running", role="router") == 1
            call.cancel()
            await until(lambda: _outcome(c, "cancelled") == 1)
            assert value(_scrape(metrics), "tandem_num_requests_running", role="router") == 0
            assert _outcome(c, "ok") == 2  # nothing counted twice

    asyncio.run(scenario())


def test_overload_and_no_worker_outcomes(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, max_inflight=1, max_queue=0) as c:
            c.decode[0].hang_after = 0
            busy = c.stub.Generate(_request())
            await busy.read()  # holds the only slot
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.generate(_request(rid="r2"))
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert _outcome(c, "overloaded") == 1
            busy.cancel()
            await until(lambda: _outcome(c, "cancelled") == 1)
            c.router.registry.set_healthy(c.decode_endpoints[0], False)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.generate(_request(rid="r3"))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert _outcome(c, "unavailable") == 1
            s = _scrape(c.router.metrics)
            assert value(s, "tandem_workers", worker_role="decode", routable="false") == 1
            assert value(s, "tandem_requests_total", outcome="ok") == 0

    asyncio.run(scenario())


def test_export_labels_the_model_and_aliases_vllm_names() -> None:
    """/metrics' registry: model_name on every series; the request-level figures also under
    vLLM's names (same values); compat "none" drops the aliases; finish reasons as vLLM's."""
    counters, ledger = HandoffCounters(), AdmissionLedger(4, 8, 100)
    registry = Registry(time.monotonic, 1.0)
    metrics = RouterMetrics(counters, ledger, registry, model_name="tiny")
    metrics.ttft.observe(0.3)
    metrics.itl.observe(0.02)
    metrics.e2e.observe(1.2)
    metrics.prompt_tokens.inc(40)
    metrics.generation_tokens.inc(8)
    metrics.succeeded("stop")
    metrics.succeeded("tool_calls")  # a tool call ends at a stop
    metrics.succeeded("length")
    metrics.finished("cancelled")  # the client went away: vLLM's "abort"
    s = _scrape(metrics)
    assert all(dict(labels).get("model_name") == "tiny" for _, labels in s)
    pairs = {
        "vllm:time_to_first_token_seconds_count": "tandem_time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_sum": "tandem_inter_token_latency_seconds_sum",
        "vllm:time_per_output_token_seconds_count": "tandem_inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_sum": "tandem_e2e_request_latency_seconds_sum",
        "vllm:prompt_tokens_total": "tandem_prompt_tokens_total",
        "vllm:generation_tokens_total": "tandem_generation_tokens_total",
    }
    for vllm, tandem in pairs.items():
        assert value(s, vllm) == value(s, tandem) > 0, vllm
    assert value(s, "vllm:time_to_first_token_seconds_bucket", le="0.5") == 1
    assert value(s, "tandem_time_to_first_token_seconds_bucket", le="2.0") == 1  # SLO bucket
    for reason, n in (("stop", 2), ("length", 1), ("abort", 1)):
        assert value(s, "vllm:request_success_total", finished_reason=reason) == n
        assert value(s, "tandem_requests_finished_total", finished_reason=reason) == n
    assert value(s, "tandem_requests_total", outcome="ok") == 3
    # engine-level state is the workers' to alias (each engine's batch, like vLLM's)
    assert not any(name == "vllm:num_requests_running" for name, _ in s)

    plain = RouterMetrics(counters, ledger, registry, model_name="tiny", compat="none")
    assert not any(name.startswith("vllm:") for name, _ in _scrape(plain))
    with pytest.raises(ValueError, match="compat"):
        RouterMetrics(counters, ledger, registry, compat="sglang")
