"""bench/planner/validation.py on a recorded sweep: the simulator against a real run.

The fixture (tests/data/planner/README.md) is one real sweep of both setups with every
point's step logs kept, and the profiles of its workers measured in the same hour. The
floors below are the counts of figures within 15% when it was recorded; a change to the
simulator, the served fits or the host model that loses agreement with the real run fails
here. For scale: the same sweep repeated right after it reproduced its own figures within
15% on 35 of 50 (bench/planner/sweep_repeat.py).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from bench.planner.placement_inputs import remote_extra_s
from bench.planner.validation import main
from bench.planner.validation_tables import within

DATA = Path(__file__).resolve().parents[2] / "data" / "planner"
RECORDED = ["--sweep", str(DATA / "sweep.json"),
            "--prefill-profile", str(DATA / "profile_cpu2.json"),
            "--decode-profile", str(DATA / "profile_cpu1.json")]
SERVED = ["--host-sharing", "served-by-length", "--serving", "served"]


def _validate(out: Path, *extra: str) -> dict:
    """planner_validation.json of the recorded sweep with ``extra`` flags."""
    assert main([*RECORDED, *extra, "--out", str(out)]) == 0
    return json.loads((out / "planner_validation.json").read_text())


def _within_by_setup(saved: dict) -> dict[str, int]:
    """Figures within 15% per setup, the calibration point left out."""
    counts: dict[str, int] = {}
    for r in saved["rows"]:
        if not r["calibration"]:
            counts[r["setup"]] = counts.get(r["setup"], 0) + within([r], 0.15)
    return counts


def _local(row: dict, side: str) -> float:
    return sum(n for k, n in row[f"{side}_decisions"].items() if k.startswith("local/"))


def test_the_simulator_reproduces_the_recorded_sweep(tmp_path: Path) -> None:
    """With the workers' served fits and the host factors by prompt length, both taken from
    the sweep's own step logs: 23 of the disaggregated setup's 25 figures within 15% and 19
    of the colocated one's as recorded. On the profiles as measured (no served fits, no host
    model) fewer: 14 and 17, so the fits carry part of the count."""
    served = _within_by_setup(_validate(tmp_path / "served", *SERVED))
    assert served["disagg"] >= 23 and served["colocated"] >= 19, served
    measured = _within_by_setup(_validate(tmp_path / "measured"))
    assert set(measured) == {"disagg", "colocated"}
    for setup, count in measured.items():
        assert count < served[setup], (setup, measured, served)


def test_the_lowest_rate_s_step_logs_predict_the_other_rates(tmp_path: Path) -> None:
    """``--served-from 0.3``: the served fits and host factors from the 0.3 req/s points'
    step logs alone, the busier points predicted from them: 19 and 18 of 25 within 15% as
    recorded, still above the real repeat's 35 of 50. The fits come from those points only:
    they rest on fewer steps than the whole sweep's."""
    saved = _validate(tmp_path, *SERVED, "--served-from", "0.3")
    counts = _within_by_setup(saved)
    assert counts["disagg"] >= 19 and counts["colocated"] >= 18, counts
    whole = _validate(tmp_path / "whole", *SERVED)
    for role, fit in saved["serving"].items():
        assert 0 < fit["steps"] < whole["serving"][role]["steps"], role


def test_handoff_served_closes_the_learnt_overhead_gap(tmp_path: Path) -> None:
    """The real router learnt a larger remote overhead for chat prompts than the simulated
    one (the real handoff's RPCs and the prefill worker's fit error under serving), so it
    kept more chat prompts local. ``--handoff served`` adds the median gap to the prefill
    profile's transfer latency; the simulated router then learns an overhead near the real
    one and its chat placement moves toward the real router's."""
    def gaps(saved: dict) -> tuple[float, float]:
        overhead, placed = [], []
        for r in saved["rows"]:
            seen = r.get("placement_inputs") or {}
            real, sim = (seen.get("real") or {}).get("chat"), (seen.get("sim") or {}).get("chat")
            if r["setup"] == "disagg" and r["mix"] == "chat" and real and sim:
                # learnt overhead plus the link's price: the simulated router prices the push
                # on the link it learns, the recorded real one learnt it into its overhead
                overhead.append(remote_extra_s(real) - remote_extra_s(sim))
                placed.append(abs(_local(r, "real") - _local(r, "sim")))
        assert overhead
        return statistics.median(overhead), sum(placed)

    without = _validate(tmp_path / "without")
    with_gap = _validate(tmp_path / "with", "--handoff", "served")
    (before, placed_before), (after, placed_after) = gaps(without), gaps(with_gap)
    assert before > 0.02  # the gap it closes: tens of ms
    assert with_gap["prefill_transfer_latency_s"] > without["prefill_transfer_latency_s"] + 0.02
    assert abs(after) < before / 3
    assert placed_after < placed_before
