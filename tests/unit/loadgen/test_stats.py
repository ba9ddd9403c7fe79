"""The serving benchmark's arithmetic: arrivals, percentiles, TPOT/ITL and goodput."""

from __future__ import annotations

import math

import pytest

from tandem.loadgen.report import table
from tandem.loadgen.stats import RequestResult, percentile, summarize
from tandem.loadgen.workload import MIXES, make_requests


def test_requests_are_reproducible_and_poisson() -> None:
    a = make_requests(MIXES["mixed"], rate=2.0, num_requests=2000, seed=5)
    b = make_requests(MIXES["mixed"], rate=2.0, num_requests=2000, seed=5)
    assert a == b
    gaps = [y.arrival_s - x.arrival_s for x, y in zip(a, a[1:], strict=False)]
    assert all(g >= 0 for g in gaps)
    assert sum(gaps) / len(gaps) == pytest.approx(0.5, rel=0.1)  # mean gap = 1 / rate
    rag = [s for s in a if s.kind == "rag"]
    assert len(rag) / len(a) == pytest.approx(0.3, abs=0.05)
    assert all(768 <= len(s.prompt_ids) <= 1024 and 16 <= s.max_tokens <= 32 for s in rag)
    assert all(1000 <= t < 30000 for s in a[:50] for t in s.prompt_ids)


def test_scale_and_bad_arguments() -> None:
    small = make_requests(MIXES["chat"], 1.0, 20, scale=0.1)
    assert all(3 <= len(s.prompt_ids) <= 10 for s in small)
    with pytest.raises(ValueError):
        make_requests(MIXES["chat"], 0.0, 5)
    with pytest.raises(ValueError):
        make_requests(MIXES["chat"], 1.0, 5, vocab=(10, 10))


def test_percentile_interpolates_like_numpy() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert percentile([0.0, 10.0], 90) == pytest.approx(9.0)
    assert math.isnan(percentile([], 50))


def _result(i: int, times: list[float], ok: bool = True) -> RequestResult:
    r = RequestResult(i, "chat", ok, token_times=times)
    r.output_tokens = len(times)
    r.ttft, r.e2e = (times[0], times[-1]) if times else (0.0, 0.0)
    return r


def test_tpot_itl_and_goodput() -> None:
    fast = _result(0, [0.5, 0.6, 0.7, 0.8])  # TTFT 0.5, TPOT 0.1
    slow = _result(1, [0.5, 1.5, 2.5])  # TPOT 1.0: misses the TPOT target
    late = _result(2, [3.0, 3.1])  # TTFT 3.0: misses the TTFT target
    failed = _result(3, [], ok=False)
    assert fast.tpot == pytest.approx(0.1) and slow.tpot == pytest.approx(1.0)
    assert fast.itls == pytest.approx([0.1, 0.1, 0.1])
    s = summarize([fast, slow, late, failed], 10.0, slo_ttft_s=1.0, slo_tpot_s=0.5)
    assert s["completed"] == 3 and s["failed"] == 1
    assert s["goodput_rps"] == pytest.approx(0.1)  # only `fast` met both targets
    assert s["goodput_share"] == pytest.approx(0.25)
    assert s["throughput_rps"] == pytest.approx(0.3)
    assert s["output_tok_s"] == pytest.approx(0.9)
    assert s["ttft"]["p50"] == pytest.approx(0.5)
    assert "| TPOT p99 (ms) |" in table({"x": s})


def test_a_worker_s_activity_comes_from_its_own_metrics_text() -> None:
    """The counters are read off what a worker's /metrics renders (the names must match)."""
    from prometheus_client import generate_latest

    from tandem.engine.outputs import EngineStats
    from tandem.loadgen.stats import worker_activity, worker_counters
    from tandem.worker.metrics import TransferTotals, WorkerMetrics

    def scrape(steps: int, tokens: int, step_s: list[float], m: WorkerMetrics) -> dict:
        for s in step_s:
            m.observe_step(s)
        m.update(EngineStats(num_running=0, num_waiting=0, num_waiting_for_remote_kv=0,
                             num_held=0, num_blocks=8, num_free_blocks=8, kv_cache_usage=0.0,
                             prefix_cache_queries=0, prefix_cache_hits=0, num_preemptions=0,
                             num_steps=steps, num_generated_tokens=tokens), TransferTotals())
        return worker_counters(generate_latest(m.registry).decode())

    m = WorkerMetrics("decode", model_name="bench")
    before = scrape(3, 5, [0.25], m)
    assert before == {"steps": 3, "step_s": 0.25, "tokens": 5}
    after = scrape(7, 17, [0.5, 0.25, 0.25, 0.5], m)
    act = worker_activity(before, after, duration_s=4.0)
    assert act == {"steps": 4, "step_s": 1.5, "tokens": 12, "busy": 0.375,
                   "mean_step_s": 0.375, "tokens_per_step": 3.0}
    assert worker_activity(after, after, 0.0)["busy"] == 0.0
