"""Prometheus metrics of a real cluster (router + prefill + decode processes, tiny model): each
worker serves /metrics on ``--metrics-port`` (announced in its READY line), the router on its
HTTP port; every family is ``tandem_*`` with a ``role`` label, parses with the official text
parser, and traffic moves the histograms and counters by what it did."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from protos.tandem.v1 import tandem_pb2, tandem_pb2_grpc, worker_pb2, worker_pb2_grpc
from tandem.local_cluster import Cluster, Proc
from tests.integration.served_model import start_workers, tiny_served_model
from tests.scrape import Samples, fetch, parse, value

N_REQUESTS, MAX_TOKENS = 3, 8
ROLES = ("router", "prefill", "decode")


@pytest.fixture(scope="module")
def cluster(tiny_dir: Callable[..., Path], smollm2_dir: Path) -> Iterator[dict[str, Proc]]:
    model = tiny_served_model(tiny_dir, smollm2_dir)
    c = Cluster()
    try:
        decode, prefill = start_workers(c, model, "--metrics-port", "0")
        router = c.start(
            "router", "--port", "0", "--http-port", "0", "--tokenizer", str(model),
            "--model-name", "tiny", "--prefill", prefill.grpc, "--decode", decode.grpc,
            "--placement", "remote",  # one KV transfer per request, counted below
        )
        yield {"router": router, "prefill": prefill, "decode": decode}
    finally:
        c.stop()


def _scrape(cluster: dict[str, Proc], role: str) -> Samples:
    proc = cluster[role]
    address = proc.info["http"] if role == "router" else proc.info["metrics"]
    samples = parse(fetch(address))
    assert {dict(labels)["role"] for _, labels in samples} == {role}
    return samples


def _stats(proc: Proc, role: str) -> worker_pb2.WorkerStats:
    with proc.channel() as channel:
        stub = (worker_pb2_grpc.DecodeServiceStub if role == "decode"
                else worker_pb2_grpc.PrefillServiceStub)(channel)
        return stub.Stats(worker_pb2.StatsRequest(), timeout=30)


def _generate(proc: Proc, text: str) -> list[tandem_pb2.GenerateResponse]:
    request = tandem_pb2.GenerateRequest(
        text=text,
        sampling=tandem_pb2.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0,
                                           ignore_eos=True),
    )
    with proc.channel() as channel:
        return list(tandem_pb2_grpc.TandemStub(channel).Generate(request, timeout=120))


def _delta(after: Samples, before: Samples, name: str) -> float:
    return value(after, name) - value(before, name)


def test_endpoints_are_announced_and_parse(cluster: dict[str, Proc]) -> None:
    for role in ("prefill", "decode"):
        host, _, port = cluster[role].info["metrics"].rpartition(":")
        assert host == "127.0.0.1" and int(port) > 0
    router = _scrape(cluster, "router")
    assert value(router, "tandem_workers", worker_role="prefill", routable="true") == 1
    assert value(router, "tandem_workers", worker_role="decode", routable="true") == 1
    for role in ("prefill", "decode"):
        s = _scrape(cluster, role)
        assert value(s, "tandem_kv_cache_blocks") == 128
        for name in ("tandem_engine_step_seconds_count", "tandem_kv_transfer_failures_total",
                     "tandem_kv_leased_blocks", "tandem_prefix_cache_hits_total",
                     "tandem_num_preemptions_total"):
            assert value(s, name) >= 0, (role, name)


def test_traffic_moves_histograms_and_counters(cluster: dict[str, Proc]) -> None:
    before = {role: _scrape(cluster, role) for role in ROLES}
    replies = [_generate(cluster["router"], f"Metrics request number {i} says hello")
               for i in range(N_REQUESTS)]
    tokens = sum(len(m.token_ids) for r in replies for m in r)
    prompts = sum(r[-1].usage.prompt_tokens for r in replies)
    assert tokens == N_REQUESTS * MAX_TOKENS
    after = {role: _scrape(cluster, role) for role in ROLES}
    r0, r1 = before["router"], after["router"]
    for name in ("tandem_time_to_first_token_seconds_count",
                 "tandem_e2e_request_latency_seconds_count",
                 "tandem_request_queue_time_seconds_count"):
        assert _delta(r1, r0, name) == N_REQUESTS, name
    assert value(r1, "tandem_requests_total", outcome="ok") - value(
        r0, "tandem_requests_total", outcome="ok") == N_REQUESTS
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

    # The Stats RPC carries the recent window and the same totals.
    pst, dst = _stats(cluster["prefill"], "prefill"), _stats(cluster["decode"], "decode")
    assert 0 < pst.ttft_p50_s <= pst.ttft_p90_s
    assert 0 < dst.itl_p50_s <= dst.itl_p90_s
    assert pst.kv_transfer_bytes_per_s > 0 and dst.kv_transfer_bytes_per_s > 0
    assert pst.kv_transfer_bytes == value(_scrape(cluster, "prefill"),
                                          "tandem_kv_transfer_bytes_total")
    assert dst.kv_transfer_bytes == pst.kv_transfer_bytes
    assert dst.num_leased_blocks == 0 and dst.kv_transfer_failures == 0
