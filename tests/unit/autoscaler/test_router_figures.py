"""The router's figures in the autoscaler: its /metrics text parsed, and the window's
percentiles and rates from two readings (counter resets included)."""

from __future__ import annotations

import math

import pytest

from tandem.autoscaler.metrics import MetricsWindow, RouterSample, Snapshot, WorkerSample
from tandem.autoscaler.router_scrape import RouterScrapeError, router_sample

TEXT = "\n".join([
    "# TYPE tandem_time_to_first_token_seconds histogram",
    'tandem_time_to_first_token_seconds_bucket{role="router",le="1.0"} 80',
    'tandem_time_to_first_token_seconds_bucket{role="router",le="2.0"} 95',
    'tandem_time_to_first_token_seconds_bucket{role="router",le="+Inf"} 100',
    'tandem_time_to_first_token_seconds_count{role="router"} 100',
    'tandem_time_to_first_token_seconds_sum{role="router"} 90',
    "# TYPE tandem_time_per_output_token_seconds histogram",
    'tandem_time_per_output_token_seconds_bucket{role="router",le="0.05"} 9',
    'tandem_time_per_output_token_seconds_bucket{role="router",le="+Inf"} 10',
    "# TYPE tandem_prompt_tokens_total counter",
    'tandem_prompt_tokens_total{role="router"} 12345',
    "# TYPE tandem_generation_tokens_total counter",
    'tandem_generation_tokens_total{role="router"} 678',
    "# TYPE tandem_request_queue_time_seconds histogram",
    'tandem_request_queue_time_seconds_count{role="router"} 101',
    "# TYPE tandem_request_generation_tokens histogram",
    'tandem_request_generation_tokens_count{role="router"} 10',
    'tandem_request_generation_tokens_sum{role="router"} 600',
    "# TYPE tandem_num_requests_waiting gauge",
    'tandem_num_requests_waiting{role="router"} 3',
    # Another role's series of the same name (a worker's registry served alongside): ignored.
    'tandem_prompt_tokens_total{role="prefill"} 999999',
    "",
])


def test_router_text_parses_into_a_sample() -> None:
    s = router_sample(TEXT)
    assert s.ttft == ((1.0, 80.0), (2.0, 95.0), (math.inf, 100.0))
    assert s.tpot == ((0.05, 9.0), (math.inf, 10.0))
    assert (s.prompt_tokens_total, s.output_tokens_total) == (12345.0, 678.0)
    assert (s.admitted_total, s.finished_total, s.finished_tokens_total) == (101, 10, 600)
    assert (s.waiting, s.running) == (3.0, 0.0)
    assert router_sample("") == RouterSample()  # an older router: nothing known
    with pytest.raises(RouterScrapeError):
        router_sample("tandem_prompt_tokens_total{role=router 1\n")


def _reading(t: float, ttft: tuple[tuple[float, float], ...], prompt: float,
             finished: float, tokens: float) -> Snapshot:
    router = RouterSample(ttft=ttft, prompt_tokens_total=prompt, admitted_total=finished,
                          finished_total=finished, finished_tokens_total=tokens, waiting=2)
    return Snapshot(t, (WorkerSample("decode", "d0"),), router)


def test_window_percentiles_and_rates_come_from_its_oldest_and_newest_reading() -> None:
    w = MetricsWindow(10.0)
    w.add(_reading(0.0, ((1.0, 1000.0), (5.0, 1000.0), (math.inf, 1000.0)), 5e5, 90, 9000))
    assert w.stats().router_ttft_p90_s is None  # one reading: no window yet
    # 100 requests in the window, 60 under 1 s and 40 in (1, 5]: p90 in the second bucket.
    w.add(_reading(5.0, ((1.0, 1060.0), (5.0, 1100.0), (math.inf, 1100.0)), 6e5, 100, 9500))
    s = w.stats()
    assert s.router_ttft_p90_s == pytest.approx(1.0 + 4.0 * (90 - 60) / 40)
    assert s.router_prompt_tokens_per_s == pytest.approx(1e5 / 5)
    assert s.router_requests_per_s == pytest.approx(2.0)
    assert s.router_output_per_request == pytest.approx(50.0)  # 500 tokens / 10 requests
    assert s.router_waiting == 2.0
    # The router restarted: its counters begin again from zero, never a negative rate.
    w.add(_reading(10.0, ((1.0, 3.0), (5.0, 3.0), (math.inf, 3.0)), 1e4, 3, 30))
    s = w.stats()
    assert s.router_prompt_tokens_per_s == pytest.approx(1e4 / 10)
    assert s.router_ttft_p90_s is not None and s.router_ttft_p90_s <= 1.0
    assert s.router_output_per_request is None  # no finished count above the first reading
