"""Rate sweeps: SLO attainment per point and the highest rate at 90% (DistServe's goodput)."""

from __future__ import annotations

import pytest

from tandem.loadgen.report import plot_sweep, sweep_table, turn_table
from tandem.loadgen.stats import RequestResult, attainment
from tandem.loadgen.sweep import max_rate, parse_mixes, parse_rates, sweep_points


def _result(ttft: float, tpot: float, ok: bool = True, n: int = 11) -> RequestResult:
    r = RequestResult(0, "chat", ok, output_tokens=n, ttft=ttft, e2e=ttft + tpot * (n - 1))
    return r


def test_attainment_counts_failures_and_both_targets() -> None:
    results = [
        _result(1.0, 0.1),  # meets both
        _result(5.0, 0.1),  # TTFT miss
        _result(1.0, 0.5),  # TPOT miss
        _result(1.0, 0.1, ok=False),  # failed
        _result(1.0, 9.0, n=1),  # one token: no TPOT, TTFT met
    ]
    assert attainment(results, 4.0, 0.25) == pytest.approx(2 / 5)
    assert attainment([], 4.0, 0.25) == 0.0


def test_max_rate_interpolates_the_crossing() -> None:
    m = max_rate([(0.6, 0.7), (0.2, 1.0), (0.4, 0.95)])  # any order
    assert m.rate == 0.4 and not m.all_miss
    assert m.interpolated == pytest.approx(0.4 + (0.95 - 0.9) / (0.95 - 0.7) * 0.2)
    assert m.estimate == m.interpolated


def test_max_rate_edges() -> None:
    top = max_rate([(0.2, 1.0), (0.4, 0.9)])  # exactly 0.9 passes; nothing above missed
    assert top.rate == 0.4 and top.interpolated is None and top.estimate == 0.4
    miss = max_rate([(0.2, 0.5), (0.4, 0.2)])
    assert miss.rate == 0.0 and miss.all_miss and miss.interpolated is None
    noisy = max_rate([(0.2, 0.85), (0.4, 0.92), (0.6, 0.3)])  # the highest pass counts
    assert noisy.rate == 0.4 and 0.4 < noisy.interpolated < 0.6


def test_points_and_parsing() -> None:
    points = sweep_points(["mixed", "multiturn"], [0.4, 0.2], seed=0)
    assert [(p.mix, p.rate) for p in points] == [
        ("mixed", 0.2), ("mixed", 0.4), ("multiturn", 0.2), ("multiturn", 0.4)]
    assert len({p.seed for p in points}) == 4  # no point reuses another's prompts
    assert points == sweep_points(["mixed", "multiturn"], [0.2, 0.4], seed=0)
    assert points[0].label == "mixed 0.2/s"
    assert parse_rates("0.6, 0.2,0.4") == [0.2, 0.4, 0.6]
    assert parse_mixes("mixed,multiturn") == ["mixed", "multiturn"]
    for bad in ("", "0,0.2", "-1"):
        with pytest.raises(ValueError):
            parse_rates(bad)
    with pytest.raises(ValueError):
        parse_mixes("mixed,nope")


def test_tables_and_plot(tmp_path) -> None:
    curves = {
        "disagg": {"mixed": [(0.2, 1.0), (0.4, 0.95), (0.6, 0.7)], "chat": [(0.2, 0.5)]},
        "disagg-remote": {"mixed": [(0.2, 1.0), (0.4, 0.92), (0.6, 0.91)], "chat": [(0.2, 1.0)]},
        "colocated": {"mixed": [(0.2, 0.95), (0.4, 0.5), (0.6, 0.2)], "chat": [(0.2, 0.95)]},
    }
    text = sweep_table(curves)
    assert "| disagg | 0.4 (~0.44) [0.2: 100%, 0.4: 95%, 0.6: 70%] | 0 (all miss)" in text
    assert "| disagg-remote | >= 0.6 [" in text
    ratios = {line.split(" | ")[0]: line for line in text.splitlines()}
    assert ratios["| adaptive/colocated"].endswith("| 0.00 (0.00) |")
    assert ratios["| remote/colocated"].endswith("| 1.00 (1.00) |")
    turns = {"disagg": {0: {"cached_share": 0.5, "cached_tokens": 100.0,
                            "prompt_tokens": 200.0}}}
    assert "| disagg | 50% (100/200) |" in turn_table(turns)
    plot_sweep(curves, tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").stat().st_size > 0
