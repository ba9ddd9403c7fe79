"""bench/serving/mix_policy.py (the explicit flip policy's mix detector) and the pure parts of
bench/serving/flip_mixshift.py (its phases and its table)."""

from __future__ import annotations

import pytest

from bench.serving.flip_mixshift import Phase, parse_phases, phase_requests, table
from bench.serving.mix_policy import MixDetector, MixPolicy, MixSettings

SETTINGS = MixSettings(window_s=6.0, high=0.8, low=0.6, min_tokens=300, dwell_s=10.0)


def _feed(policy: MixPolicy, t0: float, t1: float, prompt_per_s: float, output_per_s: float,
          totals: list[float]) -> list[tuple[float, str]]:
    """Scrapes every second from ``t0`` to ``t1`` at those token rates (``totals``: the
    counters so far, advanced); the flips asked for, each made at once."""
    asked = []
    for t in range(int(t0), int(t1)):
        totals[0] += prompt_per_s
        totals[1] += output_per_s
        role = policy.observe(float(t), totals[0], totals[1])
        if role is not None:
            asked.append((float(t), role))
            policy.flipped(float(t), role)
    return asked


def test_share_needs_a_full_window_and_enough_tokens() -> None:
    d = MixDetector(SETTINGS)
    d.observe(0.0, 0.0, 0.0)
    d.observe(5.0, 900.0, 100.0)
    assert d.share() is None  # 5 s of a 6 s window
    d.observe(6.0, 1000.0, 200.0)
    assert d.share() == pytest.approx(1000.0 / 1200.0)
    quiet = MixDetector(SETTINGS)
    quiet.observe(0.0, 0.0, 0.0)
    quiet.observe(10.0, 200.0, 50.0)
    assert quiet.share() is None  # 250 tokens: too few to call a mix


def test_share_slides_with_the_window() -> None:
    d = MixDetector(SETTINGS)
    for t in range(0, 11):  # 10 s of chat: 40 prompt, 60 output tokens a second
        d.observe(float(t), 40.0 * t, 60.0 * t)
    assert d.share() == pytest.approx(0.4)
    for t in range(11, 18):  # then 7 s of RAG: 900 prompt, 20 output a second
        d.observe(float(t), 400.0 + 900.0 * (t - 10), 600.0 + 20.0 * (t - 10))
    assert d.share() == pytest.approx(900.0 / 920.0)  # the chat seconds have left the window


def test_policy_flips_to_prefill_on_rag_and_back_on_chat_with_hysteresis_and_dwell() -> None:
    policy = MixPolicy(SETTINGS)
    totals = [0.0, 0.0]
    assert _feed(policy, 0, 20, 40.0, 60.0, totals) == []  # chat: decode already
    rag = _feed(policy, 20, 50, 900.0, 20.0, totals)
    assert [role for _, role in rag] == ["prefill"]
    assert 20.0 < rag[0][0] <= 26.0  # within a window of the shift
    # a mixed stretch between the thresholds (share 0.7): it stays where it is
    assert _feed(policy, 50, 80, 70.0, 30.0, totals) == []
    chat = _feed(policy, 80, 110, 40.0, 60.0, totals)
    assert [role for _, role in chat] == ["decode"]
    assert policy.serving == "decode"

    # a shift right after a flip waits out the dwell
    eager = MixPolicy(SETTINGS, serving="decode")
    totals = [0.0, 0.0]
    flips = _feed(eager, 0, 12, 900.0, 20.0, totals)
    flips += _feed(eager, 12, 40, 40.0, 60.0, totals)
    (t_up, up), (t_down, down) = flips
    assert (up, down) == ("prefill", "decode") and t_down - t_up >= SETTINGS.dwell_s


def test_a_refused_flip_waits_out_the_dwell() -> None:
    policy = MixPolicy(SETTINGS)
    for t in range(0, 8):
        role = policy.observe(float(t), 900.0 * t, 20.0 * t)
    assert role == "prefill"
    policy.refused(7.0)
    assert all(policy.observe(float(t), 900.0 * t, 20.0 * t) is None for t in range(8, 17))
    assert policy.observe(17.0, 900.0 * 17, 20.0 * 17) == "prefill"
    assert policy.serving == "decode"


def test_bad_settings_and_roles_are_refused() -> None:
    with pytest.raises(ValueError):
        MixSettings(high=0.5, low=0.6)
    with pytest.raises(ValueError):
        MixPolicy(SETTINGS, serving="router")
    with pytest.raises(ValueError):
        parse_phases("chat:1:30,video:1:30")
    with pytest.raises(ValueError):
        parse_phases("rag:0:30")


def test_phases_follow_one_another_with_their_kinds() -> None:
    phases = parse_phases("chat:2:20,rag:1:30,chat:2:20")
    assert phases[1] == Phase("rag", 1.0, 30.0)
    specs, phase_of = phase_requests(phases, seed=3)
    assert (specs, phase_of) == phase_requests(phases, seed=3)  # a pure function of its seed
    assert [s.index for s in specs] == list(range(len(specs)))
    assert [s.arrival_s for s in specs] == sorted(s.arrival_s for s in specs)
    spans = [(0.0, 20.0), (20.0, 50.0), (50.0, 70.0)]
    for spec, p in zip(specs, phase_of, strict=True):
        assert spans[p][0] <= spec.arrival_s < spans[p][1]
        assert spec.kind == phases[p].kind
        assert (len(spec.prompt_ids) > 500) == (spec.kind == "rag")
    assert sorted(set(phase_of)) == [0, 1, 2]


def test_table_has_a_row_per_variant_and_a_column_per_phase() -> None:
    phases = [Phase("chat", 1.0, 30.0), Phase("rag", 0.7, 45.0)]
    cell = {"requests": 30, "attainment": 0.5, "ttft_p90": 1.25, "tpot_p90": 0.02}
    rows = {"static": {"attainment": 0.5, "failed": 0, "flips": [],
                       "phase0": cell, "phase1": cell},
            "flips": {"attainment": 0.75, "failed": 0, "phase0": cell, "phase1": cell,
                      "flips": [{"to": "prefill"}, {"to": "decode"}, {"to": "prefill",
                                                                       "error": "x"}]}}
    lines = table(rows, phases).splitlines()
    assert lines[0].startswith("| variant | attainment | 1: chat 1/s | 2: rag 0.7/s |")
    assert lines[2].startswith("| static | 0.50 | 0.50 (TTFT p90 1.25 s, TPOT p90 20 ms; 30 req)")
    assert lines[3].endswith("| 0 | 2 (1, 1) |")
