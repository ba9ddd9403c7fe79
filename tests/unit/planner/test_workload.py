"""Trace generators: rates within statistical bounds, determinism, burstiness, prefixes."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tandem.planner.trace import TraceRequest, read_jsonl, write_jsonl
from tandem.planner.workload import (
    CHAT,
    CHAT_SHAPE,
    MIXES,
    RAG,
    LengthMix,
    RequestKind,
    WorkloadError,
    diurnal,
    mmpp,
    multiturn,
    poisson,
    rescale,
    summarize,
)

SIGMAS = 5.0  # bounds below are mean +- 5 standard deviations: a seeded test, not a flaky one


def _counts(trace: list[TraceRequest], window_s: float, duration_s: float) -> list[int]:
    counts = [0] * int(duration_s / window_s)
    for r in trace:
        i = int(r.arrival_s / window_s)
        if i < len(counts):
            counts[i] += 1
    return counts


def _dispersion(counts: list[int]) -> float:
    """Index of dispersion (variance / mean) of counts per window: 1 for Poisson."""
    mean = sum(counts) / len(counts)
    return sum((c - mean) ** 2 for c in counts) / (len(counts) - 1) / mean


def test_poisson_rate_within_bounds() -> None:
    rate, duration = 20.0, 1000.0
    trace = poisson(rate, duration, seed=1)
    expected = rate * duration
    assert abs(len(trace) - expected) < SIGMAS * math.sqrt(expected)
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(trace, trace[1:], strict=False))
    assert 0 < trace[0].arrival_s and trace[-1].arrival_s < duration
    # Windows of a Poisson process: index of dispersion 1, sd ~ sqrt(2 / (windows - 1)).
    counts = _counts(trace, 1.0, duration)
    assert abs(_dispersion(counts) - 1) < SIGMAS * math.sqrt(2 / (len(counts) - 1))


def test_mix_shares_and_ranges() -> None:
    trace = poisson(20.0, 500.0, MIXES["mixed"], seed=2)
    n = len(trace)
    rag = sum(r.kind == "rag" for r in trace)
    assert abs(rag - 0.3 * n) < SIGMAS * math.sqrt(n * 0.3 * 0.7)
    for r in trace:
        kind = RAG if r.kind == "rag" else CHAT
        assert kind.prompt_tokens[0] <= r.prompt_tokens <= kind.prompt_tokens[1]
        assert kind.output_tokens[0] <= r.output_tokens <= kind.output_tokens[1]
        assert r.prefix_group == -1 and r.prefix_tokens == 0
    assert {r.kind for r in poisson(5.0, 20.0, MIXES["rag"])} == {"rag"}


def test_same_seed_same_trace_and_same_arrivals_across_mixes() -> None:
    assert poisson(10.0, 50.0, seed=3) == poisson(10.0, 50.0, seed=3)
    assert poisson(10.0, 50.0, seed=3) != poisson(10.0, 50.0, seed=4)
    assert mmpp((1.0, 10.0), (5.0, 1.0), 50.0, seed=3) == mmpp((1.0, 10.0), (5.0, 1.0), 50.0,
                                                                seed=3)
    assert diurnal(5.0, 3.0, 20.0, 50.0, seed=3) == diurnal(5.0, 3.0, 20.0, 50.0, seed=3)
    assert multiturn(1.0, 50.0, seed=3) == multiturn(1.0, 50.0, seed=3)
    chat = [r.arrival_s for r in poisson(10.0, 50.0, MIXES["chat"], seed=5)]
    rag = [r.arrival_s for r in poisson(10.0, 50.0, MIXES["rag"], seed=5)]
    assert chat == rag


def test_shared_system_prompt_groups() -> None:
    kind = RequestKind("agent", prompt_tokens=(10, 20), output_tokens=(5, 5),
                       prefix_groups=3, prefix_tokens=100)
    mix = LengthMix("agents+chat", ((CHAT, 0.5), (kind, 0.5)))
    trace = poisson(20.0, 100.0, mix, seed=6)
    agents = [r for r in trace if r.kind == "agent"]
    assert {r.prefix_group for r in agents} == {0, 1, 2}
    assert all(r.prefix_tokens == 100 and 110 <= r.prompt_tokens <= 120 for r in agents)
    assert summarize(trace).prefix_share == pytest.approx(
        100 * len(agents) / sum(r.prompt_tokens for r in trace))


MMPP_RATES = (2.0, 40.0)
MMPP_DWELL = (2.0, 0.5)


def _mmpp_moments(window_s: float) -> tuple[float, float]:
    """Mean rate and index of dispersion of counts per window of the 2-state MMPP.

    pi_s = dwell_s / sum(dwell); beta = 1/dwell_0 + 1/dwell_1 (the switching rate);
    IDC(w) = 1 + 2 var(rate) / (mean beta) x (1 - (1 - exp(-beta w)) / (beta w)).
    """
    pi0 = MMPP_DWELL[0] / sum(MMPP_DWELL)
    mean = pi0 * MMPP_RATES[0] + (1 - pi0) * MMPP_RATES[1]
    var = (MMPP_RATES[1] - MMPP_RATES[0]) ** 2 * pi0 * (1 - pi0)
    beta = 1 / MMPP_DWELL[0] + 1 / MMPP_DWELL[1]
    bw = beta * window_s
    return mean, 1 + 2 * var / (mean * beta) * (1 - (1 - math.exp(-bw)) / bw)


def test_mmpp_rate_and_burstiness() -> None:
    duration = 4000.0
    trace = mmpp(MMPP_RATES, MMPP_DWELL, duration, seed=7)
    mean, _ = _mmpp_moments(1.0)
    _, idc_total = _mmpp_moments(duration)  # the count over the whole run is overdispersed
    expected = mean * duration
    assert abs(len(trace) - expected) < SIGMAS * math.sqrt(expected * idc_total)
    _, idc = _mmpp_moments(1.0)
    measured = _dispersion(_counts(trace, 1.0, duration))
    assert 1 + 0.5 * (idc - 1) < measured < 1 + 1.5 * (idc - 1)
    poisson_idc = _dispersion(_counts(poisson(mean, duration, seed=7), 1.0, duration))
    assert measured > 3 * poisson_idc


def test_mmpp_with_an_off_state() -> None:
    trace = mmpp((0.0, 50.0), (1.0, 1.0), 200.0, seed=8)
    assert trace and all(0 <= r.arrival_s < 200.0 for r in trace)


def test_diurnal_mean_and_peak_to_trough() -> None:
    mean_rate, ratio, period, periods = 5.0, 4.0, 200.0, 20
    trace = diurnal(mean_rate, ratio, period, period * periods, seed=9)
    expected = mean_rate * period * periods  # whole periods: the sinusoid averages out
    assert abs(len(trace) - expected) < SIGMAS * math.sqrt(expected)
    # Windows of w around each trough (t = 0 mod P) and peak (P/2): the integral of
    # mean (1 -+ A cos) over them is mean (w -+ A P / pi sin(pi w / P)).
    w = period / 10
    a = (ratio - 1) / (ratio + 1)
    swing = a * period / math.pi * math.sin(math.pi * w / period)
    troughs = peaks = 0
    for r in trace:
        phase = r.arrival_s % period
        if phase < w / 2 or phase >= period - w / 2:
            troughs += 1
        elif abs(phase - period / 2) < w / 2:
            peaks += 1
    assert troughs == pytest.approx(mean_rate * periods * (w - swing),
                                    abs=SIGMAS * math.sqrt(mean_rate * periods * (w - swing)))
    ratio_sd = (peaks / troughs) * math.sqrt(1 / peaks + 1 / troughs)
    assert abs(peaks / troughs - (w + swing) / (w - swing)) < SIGMAS * ratio_sd
    assert peaks / troughs < ratio  # a window averages the peak down and the trough up


def test_multiturn_prefixes_chain_turn_to_turn() -> None:
    rate, duration = 2.0, 500.0
    trace = multiturn(rate, duration, seed=10)
    by_conversation: dict[int, list[TraceRequest]] = defaultdict(list)
    for r in trace:
        by_conversation[r.conversation].append(r)
    n = len(by_conversation)
    assert abs(n - rate * duration) < SIGMAS * math.sqrt(rate * duration)
    system_len: dict[int, int] = {}
    shape = CHAT_SHAPE
    for c, turns in by_conversation.items():
        assert shape.turns[0] <= len(turns) <= shape.turns[1]
        first = turns[0]
        assert 0 <= first.prefix_group < shape.system_prompts
        # every conversation picking system prompt s shares its length
        assert system_len.setdefault(first.prefix_group, first.prefix_tokens) \
            == first.prefix_tokens
        assert shape.system_tokens[0] <= first.prefix_tokens <= shape.system_tokens[1]
        for prev, turn in zip(turns, turns[1:], strict=False):
            assert turn.prefix_group == shape.system_prompts + c
            assert turn.prefix_tokens == prev.prompt_tokens + prev.output_tokens
            assert shape.user_tokens[0] <= turn.prompt_tokens - turn.prefix_tokens \
                <= shape.user_tokens[1]
            assert turn.arrival_s >= prev.arrival_s + prev.output_tokens * shape.reply_s_per_token
        assert all(t.kind == "multiturn" and shape.output_tokens[0] <= t.output_tokens
                   <= shape.output_tokens[1] for t in turns)
    groups = Counter(turn.prefix_group for turn in trace if turn.prefix_group >= shape.system_prompts)
    assert len(groups) == sum(len(t) > 1 for t in by_conversation.values())
    assert summarize(trace).prefix_share > 0.5  # most of every prompt is history


def test_rescale_preserves_order_and_lengths() -> None:
    trace = mmpp((1.0, 10.0), (5.0, 1.0), 300.0, seed=11)
    faster = rescale(trace, 3 * summarize(trace).rate)
    assert summarize(faster).rate == pytest.approx(3 * summarize(trace).rate)
    assert [(r.prompt_tokens, r.output_tokens, r.kind) for r in faster] == \
        [(r.prompt_tokens, r.output_tokens, r.kind) for r in trace]
    assert [r.arrival_s for r in faster] == sorted(r.arrival_s for r in faster)
    assert [r.arrival_s * 3 for r in faster] == pytest.approx([r.arrival_s for r in trace])
    with pytest.raises(WorkloadError):
        rescale(trace[:1], 1.0)


def test_summarize() -> None:
    trace = [TraceRequest(0.0, 100, 10), TraceRequest(1.0, 50, 20, prefix_group=0,
                                                      prefix_tokens=30),
             TraceRequest(4.0, 50, 30, prefix_group=0, prefix_tokens=20)]
    s = summarize(trace)
    assert (s.count, s.duration_s, s.rate) == (3, 4.0, 0.5)
    assert (s.mean_prompt_tokens, s.mean_output_tokens, s.prefix_share) == (
        pytest.approx(200 / 3), 20.0, 0.25)
    assert summarize([]).count == 0


def test_jsonl_round_trip(tmp_path: Path) -> None:
    trace = multiturn(1.0, 60.0, seed=12) + poisson(2.0, 60.0, seed=12)
    trace.sort(key=lambda r: r.arrival_s)
    path = tmp_path / "trace.jsonl"
    write_jsonl(path, trace)
    assert read_jsonl(path) == trace


@pytest.mark.parametrize("make", [
    lambda: poisson(0.0, 10.0),
    lambda: poisson(1.0, -1.0),
    lambda: mmpp((0.0, 0.0), (1.0, 1.0), 10.0),
    lambda: mmpp((1.0, 2.0), (0.0, 1.0), 10.0),
    lambda: diurnal(1.0, 0.5, 10.0, 10.0),
    lambda: diurnal(1.0, 2.0, 0.0, 10.0),
    lambda: multiturn(0.0, 10.0),
    lambda: RequestKind("x", (5, 4), (1, 1)),
    lambda: RequestKind("x", (1, 4), (1, 1), prefix_groups=2),
    lambda: LengthMix("x", ((CHAT, 0.5),)),
])
def test_bad_arguments(make: object) -> None:
    with pytest.raises(WorkloadError):
        make()  # type: ignore[operator]
