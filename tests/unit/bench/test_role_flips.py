"""bench/planner/role_flips.py: the mix-shift trace, and the whole script at a toy scale
(the page with its table, command and plot)."""

from __future__ import annotations

from pathlib import Path

from bench.planner.role_flips import main, mixshift


def test_mixshift_turns_rag_heavy_at_half_time_and_back() -> None:
    trace = mixshift(rate=200.0, duration_s=300.0)
    assert trace == mixshift(rate=200.0, duration_s=300.0)  # a pure function of its seed

    def rag_share(lo: float, hi: float) -> float:
        part = [r for r in trace if lo <= r.arrival_s < hi]
        return sum(r.kind == "rag" for r in part) / len(part)

    assert rag_share(0, 30) < 0.2 and rag_share(270, 300) < 0.2
    assert 0.5 < rag_share(135, 165) < 0.7
    assert abs(len(trace) / 300.0 - 200.0) < 10  # the request rate stays put


def test_main_writes_the_page_and_the_plot(tmp_path: Path, capsys) -> None:
    assert main(["--rate", "3", "--duration", "60", "--startup-s", "20", "--flip-s", "2",
                 "--traces", "mixshift", "--variants", "coupled,flips",
                 "--out", str(tmp_path)]) == 0
    page = (tmp_path / "role_flips.md").read_text()
    assert "| mixshift | coupled |" in page and "| mixshift | flips |" in page
    assert "python -m bench.planner.role_flips --rate 3 --duration 60" in page
    assert "![GPUs held and the decode pool over time](role_flips.png)" in page
    assert (tmp_path / "role_flips.png").read_bytes()[:4] == b"\x89PNG"
    assert "| mixshift | flips |" in capsys.readouterr().out
