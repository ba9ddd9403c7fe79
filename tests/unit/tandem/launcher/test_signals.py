"""The per-worker latency window the autoscaler reads: p90, expiry, in-progress tokens."""

from __future__ import annotations

from tandem.launcher.signals import SignalRecorder


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_prefill_window_p90_queue_and_totals() -> None:
    clock = Clock()
    rec = SignalRecorder(window_s=5.0, clock=clock)
    assert rec.snapshot()["ttft_p90_s"] is None
    starts = [rec.prefill_started(100) for _ in range(10)]
    assert rec.snapshot()["queued_prompt_tokens"] == 1000
    for i, started in enumerate(starts):
        clock.t = started + 0.1 * (i + 1)  # durations 0.1 .. 1.0
        rec.prefill_ended(100, started, ok=i != 9)  # the last one failed
    snap = rec.snapshot()
    assert snap["queued_prompt_tokens"] == 0
    assert snap["prompt_tokens_total"] == 900
    assert abs(snap["ttft_p90_s"] - 0.9) < 1e-9  # p90 of 0.1 .. 0.9
    clock.t += 5.5
    assert rec.snapshot()["ttft_p90_s"] is None  # out of the window
    assert rec.snapshot()["prompt_tokens_total"] == 900  # totals are cumulative


def test_decode_gaps_are_per_token() -> None:
    clock = Clock()
    rec = SignalRecorder(window_s=5.0, clock=clock)
    rec.streamed(1, None)  # a stream's first message has no gap
    rec.streamed(2, 0.2)  # two tokens in one message after 0.2 s: 0.1 s each
    rec.streamed(1, 0.04)
    snap = rec.snapshot()
    assert snap["output_tokens_total"] == 4
    assert abs(snap["itl_mean_s"] - 0.07) < 1e-9
