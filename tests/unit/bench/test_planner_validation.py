"""bench/planner_validation.py: the simulated point replays the real point's requests."""

from __future__ import annotations

import json
from pathlib import Path

from bench.planner_validation import compare, main, trace_of
from bench.serve_workload import MIXES, make_requests
from planner.profile import Profile, StepCost, Transfer
from planner.sim.host import HostSharing
from router.handoff.placement import Slo

POINT = {"mix": "mixed", "rate": 0.5, "requests": 12, "seed": 1003, "attainment": 0.5,
         "ttft": {"p50": 1.0, "p90": 2.0}, "tpot": {"p50": 0.05, "p90": 0.08},
         "output_tok_s": 20.0, "decisions": {"remote/slo": 12}}


def _profile(path: Path) -> Path:
    Profile("m", "cpu: test", StepCost(0.01, 0.002, 0.001, 1e-7, 1e-9),
            Transfer(1e9, 0.002), kv_bytes_per_token=40_000, kv_capacity_tokens=20_000,
            chunk_tokens=2048, max_num_seqs=64).save(path)
    return path


def test_the_trace_is_the_point_s_own_requests() -> None:
    trace = trace_of(POINT, (1000, 30000), 1.0)
    specs = make_requests(MIXES["mixed"], 0.5, 12, seed=1003, vocab=(1000, 30000))
    assert [(t.arrival_s, t.prompt_tokens, t.output_tokens) for t in trace] == \
        [(s.arrival_s, len(s.prompt_ids), s.max_tokens) for s in specs]


def test_compare_sets_simulated_figures_beside_measured_ones(tmp_path: Path) -> None:
    p = Profile.load(_profile(tmp_path / "p.json"))
    row = compare("disagg", POINT, trace_of(POINT, (1000, 30000), 1.0), p, p, Slo(4, 0.25))
    assert row["requests"] == 12
    for key in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "output_tok_s"):
        v = row[key]
        assert v["sim"] > 0 and v["ratio"] == v["sim"] / v["real"]
    assert sum(row["sim_decisions"].values()) == 12


def test_main_reads_a_sweep_and_writes_its_table(tmp_path: Path, capsys) -> None:
    sweep = {"config": {"vocab": "1000,30000", "slo_ttft": 4.0, "slo_tpot": 0.25},
             "summaries": {"colocated": {"mixed 0.5/s": POINT},
                           "disagg": {"mixed 0.5/s": POINT,
                                      "multiturn 0.5/s": {**POINT, "mix": "multiturn"}}}}
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(sweep))
    prof = _profile(tmp_path / "p.json")
    assert main(["--sweep", str(path), "--prefill-profile", str(prof), "--decode-profile",
                 str(prof), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "colocated" in out and "within 15%" in out
    rows = json.loads((tmp_path / "planner_validation.json").read_text())["rows"]
    assert [(r["setup"], r["mix"]) for r in rows] == [("colocated", "mixed"), ("disagg", "mixed")]


def test_host_sharing_slows_the_disaggregated_setups_only(tmp_path: Path) -> None:
    p = Profile.load(_profile(tmp_path / "p.json"))
    trace, slo = trace_of(POINT, (1000, 30000), 1.0), Slo(4, 0.25)
    sharing = HostSharing(2.0, 1.5)
    for setup in ("disagg", "disagg-remote"):
        alone = compare(setup, POINT, trace, p, p, slo)
        shared = compare(setup, POINT, trace, p, p, slo, sharing)
        assert shared["tpot_p50"]["sim"] > alone["tpot_p50"]["sim"]
    assert compare("colocated", POINT, trace, p, p, slo, sharing) == \
        compare("colocated", POINT, trace, p, p, slo)
