"""bench/planner/sweep_repeat.py: a real run's figures against its own repeat's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.planner.sweep_repeat import main, repeat_rows
from bench.planner.validation_tables import within


def _point(mix: str, rate: float, scale: float = 1.0) -> dict:
    return {"mix": mix, "rate": rate, "ttft": {"p50": 0.2 * scale, "p90": 0.5},
            "tpot": {"p50": 0.02, "p90": 0.03 * scale}, "output_tok_s": 40.0}


def test_each_figure_is_the_repeat_s_over_the_first_s() -> None:
    first = {"summaries": {"disagg": {"chat 0.3/s": _point("chat", 0.3),
                                      "chat 0.8/s": _point("chat", 0.8),
                                      "mixed 0.8/s": _point("mixed", 0.8)},
                           "colocated": {"chat 0.8/s": _point("chat", 0.8)}}}
    second = {"summaries": {"disagg": {"chat 0.3/s": _point("chat", 0.3, 2.0),
                                       "chat 0.8/s": _point("chat", 0.8, 1.2),
                                       "mixed 0.8/s": _point("mixed", 0.8, 1.1)}}}
    rows = repeat_rows(first, second)  # chat@0.3 (the calibration point) and the setup
    assert [(r["setup"], r["mix"]) for r in rows] == [("disagg", "chat"), ("disagg", "mixed")]
    assert rows[0]["ttft_p50"] == {"first": 0.2, "second": pytest.approx(0.24),
                                   "ratio": pytest.approx(1.2)}
    assert rows[0]["output_tok_s"]["ratio"] == 1.0
    # 1.2x twice (TTFT p50, TPOT p90 at chat 0.8) out of 15%; 1.1x and 1.0x in
    assert within(rows, 0.15) == 8 and within(rows, 0.25) == 10
    assert len(repeat_rows(first, second, skip=None)) == 3


def test_main_prints_each_ratio_and_the_count_within_the_tolerance(tmp_path: Path,
                                                                   capsys) -> None:
    """Two sweep files as scripts/bench_serve writes them: the table marks the figures
    outside the tolerance and counts the others, the calibration point left out."""
    first = {"summaries": {"disagg": {"chat 0.3/s": _point("chat", 0.3),
                                      "mixed 0.8/s": _point("mixed", 0.8)},
                           "colocated": {"mixed 0.8/s": _point("mixed", 0.8)}}}
    second = {"summaries": {"disagg": {"chat 0.3/s": _point("chat", 0.3, 3.0),
                                       "mixed 0.8/s": _point("mixed", 0.8, 1.3)},
                            "colocated": {"mixed 0.8/s": _point("mixed", 0.8, 0.9)}}}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(first))
    b.write_text(json.dumps(second))
    assert main([str(a), str(b)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:3] for line in lines[1:-1]] == [
        ["disagg", "mixed", "0.80"], ["colocated", "mixed", "0.80"]]
    # disagg: TTFT p50 and TPOT p90 at 1.30x (out); colocated: 0.90x (in)
    assert lines[1].split()[3:] == ["1.30*", "1.00", "1.00", "1.30*", "1.00"]
    assert lines[2].split()[3:] == ["0.90", "1.00", "1.00", "0.90", "1.00"]
    assert lines[-1].startswith("within 15%: 8 of 10 figures")
    assert main([str(a), str(b), "--tolerance", "0.35"]) == 0
    assert "within 35%: 10 of 10 figures" in capsys.readouterr().out
    assert main([str(a), str(b), "--skip", "none"]) == 0
    assert "within 15%: 11 of 15 figures" in capsys.readouterr().out


def test_sweeps_with_nothing_in_common_or_a_bad_skip_are_refused(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"summaries": {"disagg": {"chat 0.8/s": _point("chat", 0.8)}}}))
    b.write_text(json.dumps({"summaries": {"colocated": {"chat 0.8/s": _point("chat", 0.8)}}}))
    with pytest.raises(SystemExit):
        main([str(a), str(b)])
    with pytest.raises(SystemExit):
        main([str(a), str(a), "--skip", "chat"])
    assert main([str(a), str(a), "--skip", "none"]) == 0
