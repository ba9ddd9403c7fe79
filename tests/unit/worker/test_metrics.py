"""Worker metrics: the recent window, the scrape-time snapshot, the /metrics endpoint, and what
a real in-process handoff (tiny engines, kv_transfer over TCP loopback) moves."""

from __future__ import annotations

import asyncio
import urllib.error

import pytest
from prometheus_client import generate_latest

from tandem.engine.async_engine import AsyncEngine
from tandem.engine.outputs import EngineStats
from tandem.engine.sampling_params import SamplingParams
from tandem.worker.decode import cli as decode_cli
from tandem.worker.metrics import TransferTotals, WorkerMetrics
from tandem.worker.metrics_http import MetricsBindError, MetricsServer
from tandem.worker.prefill import cli as prefill_cli
from tandem.worker.recent import RecentWindow
from tests.scrape import Samples, fetch, parse, value
from tests.unit.worker.harness import cluster, greedy, until

PROMPT = [5 + (i * 37) % 240 for i in range(41)]  # three blocks of 16, the last one partial


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _stats(**kw: float) -> EngineStats:
    fields = dict(num_running=0, num_waiting=0, num_waiting_for_remote_kv=0, num_held=0,
                  num_blocks=64, num_free_blocks=64, kv_cache_usage=0.0, prefix_cache_queries=0,
                  prefix_cache_hits=0, num_preemptions=0, num_steps=0, num_generated_tokens=0)
    fields.update(kw)
    return EngineStats(**fields)  # type: ignore[arg-type]


def _scrape(metrics: WorkerMetrics) -> Samples:
    return parse(generate_latest(metrics.registry).decode())


def test_recent_window_percentiles_rate_and_expiry() -> None:
    clock = FakeClock()
    window = RecentWindow(10.0, max_samples=5, clock=clock)
    assert window.percentile(50) == 0.0 and window.rate() == 0.0
    for v in (0.4, 0.1, 0.3, 0.2):
        window.add(v)
    assert window.percentile(50) == 0.2 and window.percentile(90) == 0.4
    assert window.percentile(100) == 0.4 and window.percentile(1) == 0.1
    assert window.rate() == pytest.approx(1.0 / 10.0)
    clock.now += 5
    window.add(2.0)
    window.add(3.0)  # over max_samples: the oldest (0.4) goes
    assert window.values() == [0.1, 0.3, 0.2, 2.0, 3.0]
    clock.now += 6  # the first four are now older than the window
    assert window.values() == [2.0, 3.0]
    assert window.percentile(50) == 2.0
    with pytest.raises(ValueError):
        RecentWindow(0.0)


def test_snapshot_renders_every_gauge_and_counter() -> None:
    metrics = WorkerMetrics("decode")
    before = _scrape(metrics)
    assert value(before, "tandem_engine_step_seconds_count", role="decode") == 0
    assert not any(name == "tandem_kv_cache_usage_ratio" for name, _ in before)  # no snapshot
    metrics.update(
        _stats(num_running=3, num_waiting=2, num_waiting_for_remote_kv=1, kv_cache_usage=0.25,
               prefix_cache_queries=96, prefix_cache_hits=32, num_preemptions=4, num_steps=9,
               num_generated_tokens=17),
        TransferTotals(bytes=4096, failures=2, leased_blocks=5),
    )
    s = _scrape(metrics)
    expect = {
        "tandem_num_requests_running": 3, "tandem_num_requests_waiting": 2,
        "tandem_num_requests_waiting_for_kv": 1, "tandem_kv_cache_usage_ratio": 0.25,
        "tandem_kv_cache_blocks": 64, "tandem_prefix_cache_queries_total": 96,
        "tandem_prefix_cache_hits_total": 32, "tandem_num_preemptions_total": 4,
        "tandem_engine_steps_total": 9, "tandem_generation_tokens_total": 17,
        "tandem_kv_transfer_bytes_total": 4096, "tandem_kv_transfer_failures_total": 2,
        "tandem_kv_leased_blocks": 5,
    }
    for name, want in expect.items():
        assert value(s, name, role="decode") == want, name
    assert not any(name.startswith("tandem_core_share") for name, _ in s)  # no share, no series
    borrowed = [0]
    metrics.borrowed_steps = lambda: borrowed[0]
    borrowed[0] = 7
    assert value(_scrape(metrics), "tandem_core_share_borrowed_steps_total", role="decode") == 7
    metrics.first_token(0.5)
    metrics.inter_token(0.02)
    metrics.transfer_committed(1000, 0.01)
    metrics.observe_step(0.003)
    s = _scrape(metrics)
    for name in ("tandem_time_to_first_token_seconds", "tandem_inter_token_latency_seconds",
                 "tandem_kv_transfer_seconds", "tandem_engine_step_seconds"):
        assert value(s, f"{name}_count", role="decode") == 1, name
    recent = metrics.recent()
    assert (recent.ttft_p50_s, recent.itl_p90_s) == (0.5, 0.02)
    assert recent.kv_transfer_bytes_per_s == pytest.approx(1000 / 60.0)


def test_metrics_endpoint_serves_refreshes_and_stops() -> None:
    metrics = WorkerMetrics("prefill")
    refreshes: list[int] = []

    async def refresh() -> None:
        refreshes.append(1)
        if len(refreshes) == 2:
            raise RuntimeError("engine stopped")
        metrics.update(_stats(num_running=len(refreshes)), TransferTotals())

    async def main() -> None:
        server = MetricsServer(metrics.registry, refresh)
        port = await server.start("127.0.0.1", 0)
        address = f"127.0.0.1:{port}"
        with pytest.raises(MetricsBindError):  # the port is taken now
            await MetricsServer(metrics.registry, refresh).start("127.0.0.1", port)
        s = parse(await asyncio.to_thread(fetch, address))
        assert value(s, "tandem_num_requests_running", role="prefill") == 1
        with pytest.raises(urllib.error.HTTPError) as err:  # a failed refresh: 503, still up
            await asyncio.to_thread(fetch, address)
        assert err.value.code == 503
        s = parse(await asyncio.to_thread(fetch, address))
        assert value(s, "tandem_num_requests_running", role="prefill") == 3
        await server.stop()
        with pytest.raises(urllib.error.URLError):
            await asyncio.to_thread(fetch, address, "/metrics", 5.0)

    asyncio.run(main())


def test_metrics_flags() -> None:
    for parser, argv in ((decode_cli.build_parser, ["--port", "0", "--kv-port", "0"]),
                         (prefill_cli.build_parser, ["--port", "0"])):
        args = parser().parse_args(argv)
        assert args.metrics_port == -1 and args.metrics_host is None
        args = parser().parse_args([*argv, "--metrics-port", "0", "--metrics-host", "0.0.0.0"])
        assert args.metrics_port == 0 and args.metrics_host == "0.0.0.0"
    for main, argv in ((decode_cli.main, ["--port", "0", "--kv-port", "0", "--metrics-port",
                                          "70000"]),
                       (prefill_cli.main, ["--port", "0", "--metrics-port", "-2"])):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2


def test_engine_steps_are_timed(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64)
    metrics = WorkerMetrics("decode")

    async def main() -> None:
        ae = AsyncEngine(engine, on_step=metrics.observe_step)
        params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
        await ae.call(lambda e: e.add_request([3, 4, 5], params, request_id="a"), stream="a")
        async for _ in ae.outputs("a"):
            pass
        await ae.shutdown()

    asyncio.run(main())
    s = _scrape(metrics)
    assert value(s, "tandem_engine_step_seconds_count", role="decode") == engine.num_steps >= 6
    assert value(s, "tandem_engine_step_seconds_sum", role="decode") > 0


@pytest.fixture
def engines(tiny_dir, make_engine):
    path = str(tiny_dir("llama", 2))
    return (make_engine(model=path, num_blocks=64, block_size=16),
            make_engine(model=path, num_blocks=64, block_size=16))


def test_handoff_moves_worker_metrics_and_stats(engines) -> None:
    decode_engine, prefill_engine = engines

    async def main() -> None:
        async with cluster(decode_engine, prefill_engine) as c:
            layout = c.decode.layout
            nbytes = layout.payload_bytes(layout.num_layers, 3)
            res = await c.reserve("r1", PROMPT, greedy(12))
            first = await c.prefill_into("r1", PROMPT, greedy(12), res)
            msgs = await c.decode_all("r1")
            assert len([first.first_token] + [t for m in msgs for t in m.token_ids]) == 12

            pst = await c.prefill_stats()
            assert pst.kv_transfer_bytes == nbytes and pst.kv_transfer_failures == 0
            assert pst.ttft_p50_s == pst.ttft_p90_s > 0 and pst.kv_transfer_bytes_per_s > 0
            assert pst.num_leased_blocks == 0
            dst = await c.decode_stats()
            assert dst.kv_transfer_bytes == nbytes and dst.kv_transfer_failures == 0
            assert 0 < dst.itl_p50_s <= dst.itl_p90_s and dst.kv_transfer_bytes_per_s > 0

            c.prefill.metrics.update(await c.prefill.stats(), c.prefill.transfer_totals())
            c.decode.metrics.update(await c.decode.stats(), c.decode.transfer_totals())
            p, d = _scrape(c.prefill.metrics), _scrape(c.decode.metrics)
            assert value(p, "tandem_time_to_first_token_seconds_count", role="prefill") == 1
            assert value(p, "tandem_kv_transfer_seconds_count", role="prefill") == 1
            assert value(p, "tandem_kv_transfer_bytes_total", role="prefill") == nbytes
            assert value(p, "tandem_prefix_cache_queries_total", role="prefill") == len(PROMPT)
            assert value(d, "tandem_kv_transfer_seconds_count", role="decode") == 1
            assert value(d, "tandem_kv_transfer_seconds_sum", role="decode") > 0
            # The first token came with the commit; each of the other 11 followed a gap.
            assert value(d, "tandem_inter_token_latency_seconds_count", role="decode") == 11
            assert value(d, "tandem_kv_cache_usage_ratio", role="decode") == 0.0

            # A reservation whose lease runs out fails on both sides.
            res = await c.reserve("r2", PROMPT, greedy(4), lease_s=0.2)
            await until(c.decode_stats, lambda s: s.kv_transfer_failures == 1)
            with pytest.raises(Exception):  # noqa: B017 - the push is refused, whatever its code
                await c.prefill_into("r2", PROMPT, greedy(4), res)
            pst = await c.prefill_stats()
            assert pst.kv_transfer_failures == 1 and pst.num_leased_blocks == 0
            assert (await c.decode_stats()).num_leased_blocks == 0

    asyncio.run(main())


def test_export_labels_the_model_and_aliases_engine_figures() -> None:
    """Engine-level figures also under vLLM's names, per engine (role label kept), with
    model_name; request-level ones (TTFT, ITL, tokens) are the router's to alias."""
    metrics = WorkerMetrics("decode", model_name="tiny")
    metrics.first_token(0.2)
    metrics.update(
        _stats(num_running=3, num_waiting=2, kv_cache_usage=0.25, prefix_cache_queries=96,
               prefix_cache_hits=32, num_preemptions=4, spec_num_steps=5,
               spec_proposed_tokens=20, spec_accepted_tokens=12, num_stranded_blocks=1),
        TransferTotals())
    s = _scrape(metrics)
    assert all(dict(labels)["model_name"] == "tiny" and dict(labels)["role"] == "decode"
               for _, labels in s)
    expect = {
        "vllm:num_requests_running": 3, "vllm:num_requests_waiting": 2,
        "vllm:kv_cache_usage_perc": 0.25, "vllm:gpu_cache_usage_perc": 0.25,
        "vllm:prefix_cache_queries_total": 96, "vllm:prefix_cache_hits_total": 32,
        "vllm:num_preemptions_total": 4, "vllm:spec_decode_num_drafts_total": 5,
        "vllm:spec_decode_num_draft_tokens_total": 20,
        "vllm:spec_decode_num_accepted_tokens_total": 12, "tandem_kv_stranded_blocks": 1,
    }
    for name, want in expect.items():
        assert value(s, name) == want, name
    names = {name for name, _ in s}
    assert "vllm:time_to_first_token_seconds_count" not in names
    assert "vllm:generation_tokens_total" not in names
    plain = WorkerMetrics("prefill", compat="none")
    plain.update(_stats(), TransferTotals())
    assert not any(name.startswith("vllm:") for name, _ in _scrape(plain))
