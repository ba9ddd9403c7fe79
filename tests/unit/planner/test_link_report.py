"""When disaggregation stops paying on a link: the router's decision asked over prompt
lengths and link speeds (pure)."""

from __future__ import annotations

import pytest

from tandem.placement.link import LinkPrior
from tandem.placement.slo import Slo
from tandem.planner.link_report import goes_remote, link_report, shortest_remote, slowest_link
from tandem.planner.profile import Profile, StepCost, Transfer

SLO = Slo(ttft_s=2.0, tpot_s=0.1)


def _profile(per_token: float, chunk: int) -> Profile:
    # a Llama-3-8B-shaped KV: 128 KiB a token
    return Profile("m", "test", StepCost(0.03, 0.002, per_token, 0.0), Transfer(1e12, 0.0),
                   kv_bytes_per_token=131_072, kv_capacity_tokens=100_000, chunk_tokens=chunk,
                   max_num_seqs=4)


PREFILL = _profile(0.0004, 2048)
DECODE = _profile(0.0004, 128)  # chunked local prefill: 126 tokens a step beside 2 rows


def test_a_fast_link_sends_long_prompts_remote_and_a_slow_one_keeps_them() -> None:
    assert goes_remote(PREFILL, DECODE, SLO, LinkPrior(100, 0.001), 1000, rows=2)
    assert not goes_remote(PREFILL, DECODE, SLO, LinkPrior(1, 0.001), 1000, rows=2)


def test_the_shortest_remote_prompt_and_the_slowest_link_are_the_decision_boundaries() -> None:
    link = LinkPrior(10, 0.001)
    short = shortest_remote(PREFILL, DECODE, SLO, link, rows=2, max_tokens=4000)
    assert short is not None and 1 < short < 4000
    assert goes_remote(PREFILL, DECODE, SLO, link, short, rows=2)
    assert not goes_remote(PREFILL, DECODE, SLO, link, short - 1, rows=2)
    slow = slowest_link(PREFILL, DECODE, SLO, 0.001, 1000, rows=2)
    assert slow is not None and 1 < slow < 100
    assert goes_remote(PREFILL, DECODE, SLO, LinkPrior(slow * 1.01, 0.001), 1000, rows=2)
    assert not goes_remote(PREFILL, DECODE, SLO, LinkPrior(slow * 0.99, 0.001), 1000, rows=2)
    # the wire per token equals what remote saves per token there: 131,072 B at the
    # boundary rate against the local option's chunk steps (34 ms per 126 tokens) less
    # the remote option's (30 ms per 2,048)
    saved = 0.034 / 126 - 0.03 / 2048
    assert slow * 1e9 / 8 == pytest.approx(131_072 / saved, rel=0.1)


def test_the_report_names_both_boundaries() -> None:
    text, verdicts = link_report(PREFILL, DECODE, SLO, LinkPrior(1, 0.5e-3), 1000, 4000)
    assert text.startswith("link 1 Gb/s, RTT 0.5 ms: a push costs 1048.6 ms per 1k")
    assert [v.rows for v in verdicts] == [1, 2]
    assert "stays colocated" in text
    assert all(v.slowest_gbps is not None and v.slowest_gbps > 1 for v in verdicts)
