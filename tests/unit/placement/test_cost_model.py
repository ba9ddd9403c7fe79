"""The placement cost model: predictions on synthetic worker signals, and the decision."""

from __future__ import annotations

import pytest

from tandem.placement.cost_model import Decision, Reason, decide, predict_local, predict_remote
from tandem.placement.link import LinkPrior, kv_bytes_per_token
from tandem.placement.slo import Slo
from tandem.placement.worker_view import Role, WorkerView

SLO = Slo(ttft_s=2.0, tpot_s=0.1)


def decode(running: int = 4, per_token: float | None = 0.0004, queued: int = 0,
           chunk: int = 256, name: str = "d0") -> WorkerView:
    return WorkerView(name, Role.DECODE, num_running=running, step_base_s=0.03,
                      step_per_row_s=0.002, step_per_prefill_token_s=per_token,
                      queued_prefill_tokens=queued, max_batched_tokens=chunk)


def prefill(queued: int = 0, per_token: float | None = 0.0004, name: str = "p0"
            ) -> WorkerView:
    return WorkerView(name, Role.PREFILL, step_base_s=0.01, step_per_prefill_token_s=per_token,
                      queued_prefill_tokens=queued, max_batched_tokens=2048)


def test_remote_prediction_counts_the_queue_ahead() -> None:
    d = decode()
    idle = predict_remote(prefill(), d, 1000)
    busy = predict_remote(prefill(queued=3000), d, 1000, overhead_s=0.05)
    assert idle is not None and busy is not None
    assert idle.ttft_s == pytest.approx(0.01 + 0.4)
    # 4,000 tokens at 2,048 per step: 2 steps of base, plus the overhead the router measured.
    assert busy.ttft_s == pytest.approx(2 * 0.01 + 4000 * 0.0004 + 0.05)
    assert idle.decode_gap_s == pytest.approx(0.03 + 0.002 * 5)


def test_local_prediction_is_chunked_between_decode_rows() -> None:
    p = predict_local(decode(running=4, chunk=256), 1000)
    assert p is not None
    # 252 prompt tokens per step beside 4 rows: 4 steps; every running stream sees the chunk.
    assert p.ttft_s == pytest.approx(4 * (0.03 + 0.008) + 1000 * 0.0004)
    assert p.decode_gap_s == pytest.approx(0.03 + 0.002 * 5 + 252 * 0.0004)


def test_short_chat_turn_on_idle_decode_goes_local() -> None:
    placed = decide(60, decode(running=2), [prefill(queued=4000)], SLO)
    assert placed.decision is Decision.LOCAL and placed.reason is Reason.SLO


def test_long_prompt_that_would_stall_decoders_goes_remote() -> None:
    placed = decide(1000, decode(running=8), [prefill()], SLO)
    assert placed.decision is Decision.REMOTE and placed.reason is Reason.SLO
    assert placed.endpoint == "p0"
    assert placed.predicted is not None and placed.predicted.decision is Decision.REMOTE


def test_each_side_carries_its_own_learnt_overhead() -> None:
    """The decode worker's learnt local overhead goes into the local option as a prefill
    worker's does into its remote one: with only remote corrected, a fit that is low on
    every worker of a slow host would count against remote alone."""
    d, p = decode(running=2), prefill(queued=300)
    plain = decide(100, d, [p], SLO)
    assert plain.decision is Decision.LOCAL and plain.predicted is not None
    assert plain.predicted.overhead_s == 0.0
    assert plain.predicted.compute_s == plain.predicted.ttft_s
    # Remote is 0.01 + 400 * 0.0004 = 0.17 s, local 0.034 + 100 * 0.0004 = 0.074 s: a local
    # overhead of 0.12 s tips it; the same figure on the prefill worker does not.
    assert decide(100, d, [p], SLO, overhead_s={"p0": 0.12}).decision is Decision.LOCAL
    placed = decide(100, d, [p], SLO, overhead_s={"d0": 0.12})
    assert placed.decision is Decision.REMOTE
    local = predict_local(d, 100, overhead_s=0.12)
    assert local is not None and local.ttft_s == pytest.approx(0.074 + 0.12)
    assert local.compute_s == pytest.approx(0.074) and local.overhead_s == 0.12
    # A learnt figure is never negative in a prediction.
    low = predict_local(d, 100, overhead_s=-0.05)
    assert low is not None and low.ttft_s == pytest.approx(0.074) and low.overhead_s == 0.0


def test_remote_wins_a_tie() -> None:
    d = WorkerView("d0", Role.DECODE, step_base_s=0.0, step_per_row_s=0.0,
                   step_per_prefill_token_s=0.001, max_batched_tokens=2048)
    p = WorkerView("p0", Role.PREFILL, step_base_s=0.0, step_per_prefill_token_s=0.001)
    assert decide(100, d, [p], SLO).decision is Decision.REMOTE


def test_picks_the_prefill_worker_inside_the_target() -> None:
    busy, idle = prefill(queued=10_000, name="p-busy"), prefill(name="p-idle")
    placed = decide(1000, decode(running=8), [busy, idle], SLO)
    assert placed.decision is Decision.REMOTE and placed.endpoint == "p-idle"


def test_none_feasible_takes_the_smallest_miss() -> None:
    # Both sides are swamped; the decode worker's queue is worse.
    placed = decide(3000, decode(running=30, queued=20_000), [prefill(queued=8000)], SLO)
    assert placed.reason is Reason.CHEAPEST
    assert placed.decision is Decision.REMOTE


def test_prefix_cached_on_decode_makes_local_cheap() -> None:
    d = decode(running=8)
    assert decide(1000, d, [prefill()], SLO).decision is Decision.REMOTE
    placed = decide(1000, d, [prefill()], SLO, cached={"d0": 960})
    assert placed.decision is Decision.LOCAL


def test_decode_without_prefill_history_borrows_the_prefill_cost() -> None:
    d = decode(running=2, per_token=None)
    assert predict_local(d, 60) is None
    placed = decide(60, d, [prefill(queued=2000)], SLO)
    assert placed.decision is Decision.LOCAL and placed.predicted is not None
    assert placed.predicted.ttft_s == pytest.approx(0.03 + 0.004 + 60 * 0.0004)


def test_without_signals_remote_as_before() -> None:
    bare_d = WorkerView("d0", Role.DECODE)
    bare_p = WorkerView("p0", Role.PREFILL)
    placed = decide(60, bare_d, [bare_p], SLO)
    assert (placed.decision, placed.reason, placed.endpoint) == (
        Decision.REMOTE, Reason.NO_SIGNAL, "p0")


def test_colocated_and_threshold_override() -> None:
    assert decide(5000, decode(), [], SLO).reason is Reason.COLOCATED
    short = decide(60, decode(running=30), [prefill()], SLO, threshold=128)
    long = decide(600, decode(running=0), [prefill()], SLO, threshold=128)
    edge = decide(128, decode(running=0), [prefill()], SLO, threshold=128)
    assert edge.decision is Decision.REMOTE  # "shorter than" the threshold goes local
    assert (short.decision, short.reason) == (Decision.LOCAL, Reason.THRESHOLD)
    assert (long.decision, long.reason, long.endpoint) == (
        Decision.REMOTE, Reason.THRESHOLD, "p0")


def test_the_routers_own_count_of_running_streams_is_used_when_larger() -> None:
    reported = decode(running=2)
    counted = WorkerView("d0", Role.DECODE, num_running=2, active=30, step_base_s=0.03,
                         step_per_row_s=0.002, step_per_prefill_token_s=0.0004,
                         max_batched_tokens=256)
    a, b = predict_local(reported, 60), predict_local(counted, 60)
    assert a is not None and b is not None
    assert b.decode_gap_s == pytest.approx(a.decode_gap_s + 28 * 0.002)


def _link_s(gbps: float, tokens: int) -> dict[str, float]:
    """The push of ``tokens`` tokens of a Llama-3-8B-shaped KV (128 KiB a token) to the
    decode worker on a ``gbps`` link with a 1 ms round trip, priced for prefill worker p0."""
    per_token = kv_bytes_per_token(32, 8, 128, "bfloat16")
    return {"p0": LinkPrior(gbps, 0.001).seconds(tokens * per_token)}


def test_a_slow_link_keeps_a_long_prompt_local() -> None:
    """The same prompt and the same workers: on a 100 Gb/s link the push costs 11 ms and
    the idle prefill worker's TTFT wins; on 1 Gb/s it costs over a second, more than the
    decode worker's chunked prefill adds, so the prompt stays local."""
    d = decode(running=2, chunk=128)
    fast = decide(1000, d, [prefill()], SLO, link_s=_link_s(100, 1000))
    slow = decide(1000, d, [prefill()], SLO, link_s=_link_s(1, 1000))
    assert fast.decision is Decision.REMOTE and fast.reason is Reason.SLO
    assert fast.predicted is not None and fast.predicted.link_s == pytest.approx(0.0115, rel=0.01)
    assert slow.decision is Decision.LOCAL and slow.reason is Reason.SLO
    # the link is its own term: not compute, not the learnt overhead
    remote = predict_remote(prefill(), d, 1000, link_s=_link_s(1, 1000)["p0"])
    assert remote is not None and remote.link_s > 1.0
    assert remote.compute_s == pytest.approx(0.01 + 0.4)
    assert remote.modelled_s == pytest.approx(remote.ttft_s)


def test_the_link_price_scales_with_the_bytes_the_push_moves() -> None:
    """A short prompt's push is cheap even on the slow link: it still goes remote when the
    decode worker is too busy to take it inside the token-gap target."""
    d = decode(running=8, chunk=256)
    placed = decide(200, d, [prefill()], SLO, link_s=_link_s(1, 200))
    assert placed.decision is Decision.REMOTE
