"""Prometheus metrics of a real ``tandem local`` (router + prefill + decode processes, tiny
model): each worker serves /metrics on a free loopback port (announced in the READY line),
the router on its HTTP port; every family is ``tandem_*`` (or vLLM's name for the same
figure) with ``role`` and ``model_name`` labels, parses with the official text parser, and
traffic moves the histograms and counters by what it did. The chart's Grafana dashboard and
alert rules name only series these three endpoints export (docs/metrics.md)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tandem.common.security.grpc_auth import ROUTER_AUDIENCE, sync_channel
from tandem.engine.native import load as load_native
from tandem.launcher.local_cluster import Cluster, Proc
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests.helm.chart import CHART, EXAMPLES, load_values, objects, render
from tests.integration.served_model import MODEL_ID, tiny_served_model
from tests.promql import dashboard_queries, metric_names, rule_queries
from tests.scrape import Samples, fetch, parse, value

N_REQUESTS, MAX_TOKENS = 3, 8
ROLES = ("router", "prefill", "decode")


@dataclass
class Local:
    """A running ``tandem local`` and the endpoints it announced."""

    proc: Proc
    cluster: Cluster

    @property
    def metrics(self) -> dict[str, str]:
        return dict(self.proc.info["metrics"])

    def channel(self, role: str):  # type: ignore[no-untyped-def]
        """A channel to the router's or a worker's gRPC port, as a cluster member calls."""
        import grpc

        target = self.proc.grpc if role == "router" else self.proc.info["workers"][role]
        audience = ROUTER_AUDIENCE if role == "router" else target
        return sync_channel(grpc.insecure_channel(target), self.cluster.credential, audience)


@pytest.fixture(scope="module")
def local(tiny_dir: Callable[..., Path], smollm2_dir: Path) -> Iterator[Local]:
    model = tiny_served_model(tiny_dir, smollm2_dir)
    c = Cluster()  # its credential, handed to tandem local, lets the test call the workers
    try:
        proc = c.start(
            "tandem.launcher.local", "--model", str(model), "--model-name", MODEL_ID, "--port", "0",
            "--prefill-threads", "1", "--decode-threads", "1", "--dtype", "float32",
            "--num-blocks", "128", *(c.credential_flags or ()),
            "--router-arg=--placement=remote",  # one KV transfer per request, counted below
        )
        yield Local(proc, c)
    finally:
        c.stop()  # SIGTERM: tandem local drains and stops its three processes


def _scrape(local: Local, role: str) -> Samples:
    samples = parse(fetch(local.metrics[role]))
    assert {dict(labels)["role"] for _, labels in samples} == {role}
    assert {dict(labels)["model_name"] for _, labels in samples} == {MODEL_ID}
    return samples


def _stats(local: Local, role: str) -> worker_pb2.WorkerStats:
    with local.channel(role) as channel:
        stub = (worker_pb2_grpc.DecodeServiceStub if role == "decode"
                else worker_pb2_grpc.PrefillServiceStub)(channel)
        return stub.Stats(worker_pb2.StatsRequest(), timeout=30)


def _generate(local: Local, text: str) -> list[tandem_pb2.GenerateResponse]:
    request = tandem_pb2.GenerateRequest(
        text=text,
        sampling=tandem_pb2.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0,
                                           ignore_eos=True),
    )
    with local.channel("router") as channel:
        return list(tandem_pb2_grpc.TandemStub(channel).Generate(request, timeout=120))


def _delta(after: Samples, before: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def test_endpoints_are_announced_and_parse(local: Local) -> None:
    assert set(local.metrics) == set(ROLES)
    for role in ("prefill", "decode"):
        host, _, port = local.metrics[role].rpartition(":")
        assert host == "127.0.0.1" and int(port) > 0
    router = _scrape(local, "router")
    assert value(router, "tandem_workers", worker_role="prefill", routable="true") == 1
    assert value(router, "tandem_workers", worker_role="decode", routable="true") == 1
    for role in ("prefill", "decode"):
        s = _scrape(local, role)
        assert value(s, "tandem_kv_cache_blocks") == 128
        for name in ("tandem_engine_step_seconds_count", "tandem_kv_transfer_failures_total",
                     "tandem_kv_leased_blocks", "tandem_prefix_cache_hits_total",
                     "tandem_num_preemptions_total", "tandem_kv_stranded_blocks"):
            assert value(s, name) >= 0, (role, name)
    # tandem local's decode worker borrows the idle prefill worker's cores (fused path only)
    borrowing = [n for n, _ in _scrape(local, "decode")
                 if n == "tandem_core_share_borrowed_steps_total"]
    assert borrowing == ([] if load_native() is None else ["tandem_core_share_borrowed_steps_total"])


def test_traffic_moves_histograms_and_counters(local: Local) -> None:
    before = {role: _scrape(local, role) for role in ROLES}
    replies = [_generate(local, f"Metrics request number {i} says hello")
               for i in range(N_REQUESTS)]
    tokens = sum(len(m.token_ids) for r in replies for m in r)
    prompts = sum(r[-1].usage.prompt_tokens for r in replies)
    assert tokens == N_REQUESTS * MAX_TOKENS
    after = {role: _scrape(local, role) for role in ROLES}
    r0, r1 = before["router"], after["router"]
    for name in ("tandem_time_to_first_token_seconds_count",
                 "tandem_e2e_request_latency_seconds_count",
                 "tandem_request_queue_time_seconds_count"):
        assert _delta(r1, r0, name) == N_REQUESTS, name
    assert _delta(r1, r0, "tandem_requests_total", outcome="ok") == N_REQUESTS
    assert _delta(r1, r0, "tandem_requests_finished_total", finished_reason="length") == N_REQUESTS
    assert _delta(r1, r0, "tandem_generation_tokens_total") == tokens
    assert _delta(r1, r0, "tandem_prompt_tokens_total") == prompts
    assert 0 < _delta(r1, r0, "tandem_inter_token_latency_seconds_count") <= tokens - N_REQUESTS
    assert _delta(r1, r0, "tandem_e2e_request_latency_seconds_sum") > 0
    assert value(r1, "tandem_num_requests_running") == 0

    p0, p1 = before["prefill"], after["prefill"]
    assert _delta(p1, p0, "tandem_time_to_first_token_seconds_count") == N_REQUESTS
    assert _delta(p1, p0, "tandem_kv_transfer_seconds_count") == N_REQUESTS
    assert _delta(p1, p0, "tandem_kv_transfer_bytes_total") > 0
    assert _delta(p1, p0, "tandem_prefix_cache_queries_total") == prompts
    assert _delta(p1, p0, "tandem_engine_step_seconds_count") >= N_REQUESTS

    d0, d1 = before["decode"], after["decode"]
    assert _delta(d1, d0, "tandem_kv_transfer_seconds_count") == N_REQUESTS
    assert _delta(d1, d0, "tandem_kv_transfer_bytes_total") == _delta(
        p1, p0, "tandem_kv_transfer_bytes_total")
    assert 0 < _delta(d1, d0, "tandem_inter_token_latency_seconds_count") <= (
        tokens - N_REQUESTS)
    assert _delta(d1, d0, "tandem_engine_step_seconds_count") >= MAX_TOKENS - 1
    # The committed first token joins the decode engine's output too.
    assert _delta(d1, d0, "tandem_generation_tokens_total") == tokens
    for role in ("prefill", "decode"):
        s = after[role]
        assert 0.0 <= value(s, "tandem_kv_cache_usage_ratio") <= 1.0
        assert value(s, "tandem_kv_transfer_failures_total") == 0
        assert value(s, "tandem_num_requests_waiting") >= 0
        assert value(s, "tandem_kv_stranded_blocks") == 0  # every block in use is held

    # The Stats RPC carries the recent window and the same totals.
    pst, dst = _stats(local, "prefill"), _stats(local, "decode")
    assert 0 < pst.ttft_p50_s <= pst.ttft_p90_s
    assert 0 < dst.itl_p50_s <= dst.itl_p90_s
    assert pst.kv_transfer_bytes_per_s > 0 and dst.kv_transfer_bytes_per_s > 0
    assert pst.kv_transfer_bytes == value(_scrape(local, "prefill"),
                                          "tandem_kv_transfer_bytes_total")
    assert dst.kv_transfer_bytes == pst.kv_transfer_bytes
    assert dst.num_leased_blocks == 0 and dst.kv_transfer_failures == 0


def test_vllm_names_carry_the_same_figures(local: Local) -> None:
    """What vLLM dashboards read: request-level figures from the router, engine-level ones
    per worker, equal to the tandem_* series they alias."""
    router = _scrape(local, "router")
    assert value(router, "tandem_time_to_first_token_seconds_count") > 0  # traffic ran
    for vllm, tandem in (
        ("vllm:time_to_first_token_seconds_count", "tandem_time_to_first_token_seconds_count"),
        ("vllm:inter_token_latency_seconds_sum", "tandem_inter_token_latency_seconds_sum"),
        ("vllm:e2e_request_latency_seconds_count", "tandem_e2e_request_latency_seconds_count"),
        ("vllm:prompt_tokens_total", "tandem_prompt_tokens_total"),
        ("vllm:generation_tokens_total", "tandem_generation_tokens_total"),
    ):
        assert value(router, vllm) == value(router, tandem), vllm
    assert value(router, "vllm:request_success_total", finished_reason="length") == value(
        router, "tandem_requests_finished_total", finished_reason="length")
    for role in ("prefill", "decode"):
        s = _scrape(local, role)
        for vllm, tandem in (("vllm:kv_cache_usage_perc", "tandem_kv_cache_usage_ratio"),
                             ("vllm:num_requests_running", "tandem_num_requests_running"),
                             ("vllm:num_requests_waiting", "tandem_num_requests_waiting"),
                             ("vllm:prefix_cache_queries_total",
                              "tandem_prefix_cache_queries_total")):
            assert value(s, vllm) == value(s, tandem), (role, vllm)
        assert not any(name == "vllm:generation_tokens_total" for name, _ in s)


def test_chart_dashboard_and_alerts_name_only_exported_series(local: Local) -> None:
    """The issue's done-when: load the chart's dashboard and rules, and every panel query and
    alert expression names series the cluster's three /metrics endpoints export (a histogram
    by its _bucket/_sum/_count samples, a counter by its _total)."""
    if value(_scrape(local, "router"), "tandem_requests_total", outcome="ok") == 0:
        _generate(local, "one request, so every per-request series has a sample")
    exported = {name for role in ROLES for name, _ in _scrape(local, role)}
    dashboard = json.loads((CHART / "files" / "grafana" / "tandem.json").read_text())
    values = load_values(EXAMPLES / "gpu-multinode-autoscale.yaml")
    values["metrics"]["prometheusRule"] = {"enabled": True}
    rule = next(o for o in objects(render(values)) if o["kind"] == "PrometheusRule")
    queries = [*dashboard_queries(dashboard), *rule_queries(rule)]
    assert len(queries) > 40
    for where, expr in queries:
        missing = metric_names(expr) - exported
        assert not missing, (where, sorted(missing))
