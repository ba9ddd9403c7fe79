"""bench/planner/validation.py: the simulated point replays the real point's requests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.planner.validation import TWO_WORKERS, add_sensitivity, compare, main, trace_of
from bench.planner.validation_inputs import host_sharing_of, served_overlaps, served_profiles
from bench.planner.validation_tables import profile_table, table, worker_table
from bench.serving.step_overlap import overlap_table
from tandem.loadgen.workload import MIXES, make_requests
from tandem.placement.slo import Slo
from tandem.planner.profile import Profile, StepCost, Transfer
from tandem.planner.sim.host import HostSharing

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


def test_sensitivity_gives_each_figure_its_range_over_the_decode_factor(tmp_path: Path) -> None:
    p = Profile.load(_profile(tmp_path / "p.json"))
    point = {**POINT, "rate": 4.0, "requests": 30}  # busy: every TPOT beside a prefill
    trace, slo = trace_of(point, (1000, 30000), 1.0), Slo(4, 0.25)
    sharing = HostSharing(((1, 2.0), (8, 1.5)), 1.5)
    row = compare("disagg-remote", point, trace, p, p, slo, sharing)
    add_sensitivity(row, point, trace, p, p, slo, sharing, 0.1)
    low = compare("disagg-remote", point, trace, p, p, slo, sharing.decode_scaled(0.9))
    high = compare("disagg-remote", point, trace, p, p, slo, sharing.decode_scaled(1.1))
    tpot = row["tpot_p50"]
    assert tpot["range"] == [low["tpot_p50"]["ratio"], high["tpot_p50"]["ratio"]]
    assert tpot["range"][0] <= tpot["ratio"] <= tpot["range"][1]
    assert tpot["range"][0] < tpot["range"][1]
    # the count: a figure counts where its range meets the band around 1
    for key, ratio, span in (("ttft_p50", 1.3, [1.2, 1.4]), ("ttft_p90", 1.0, [0.9, 1.1]),
                             ("tpot_p50", 1.3, [1.1, 1.5]), ("tpot_p90", 0.6, [0.5, 0.86]),
                             ("output_tok_s", 0.8, [0.8, 0.8])):
        row[key]["ratio"], row[key]["range"] = ratio, span
    lines = table([row], 0.15).splitlines()
    assert lines[-2].startswith("within 15%: 1 of 5")
    assert lines[-1].endswith("range: 3 of 5")


def test_the_workers_activity_is_compared_where_the_sweep_recorded_it(tmp_path: Path) -> None:
    p = Profile.load(_profile(tmp_path / "p.json"))
    trace, slo = trace_of(POINT, (1000, 30000), 1.0), Slo(4, 0.25)
    assert "workers" not in compare("disagg", POINT, trace, p, p, slo)
    point = {**POINT, "workers": {
        "decode": {"busy": 0.5, "mean_step_s": 0.02, "tokens_per_step": 1.5},
        "prefill": {"busy": 0.25, "mean_step_s": 0.3}}}
    row = compare("disagg", point, trace, p, p, slo)
    w = row["workers"]
    assert (w["decode_busy"]["real"], w["decode_step_s"]["real"], w["prefill_busy"]["real"]) \
        == (0.5, 0.02, 0.25)
    assert 0 < w["decode_busy"]["sim"] < 1 and 0 < w["prefill_busy"]["sim"] < 1
    assert w["decode_step_s"]["sim"] > 0.01  # at least a one-row step of the profile
    assert w["decode_rows"]["real"] == 1.5 and w["decode_rows"]["sim"] >= 1.0
    assert "prefill_busy" not in compare("colocated", point, trace, p, p, slo)["workers"]
    lines = worker_table([row]).splitlines()
    assert len(lines) == 2 and lines[1].startswith("disagg") and "20.0 /" in lines[1]
    assert "  1.5 /" in lines[1]
    assert worker_table([compare("disagg", POINT, trace, p, p, slo)]) == ""


def _overlap(factor_1: float, factor_2: float | None, prefill: float) -> dict:
    def band(factor: float | None, steps: int = 20) -> dict:
        return {"alone": steps, "alone_s": 0.01, "shared": steps if factor else 0,
                "shared_s": 0.01 * factor if factor else None, "factor": factor}
    return {"decode_shared": 0.4, "prefill_shared": 0.3,
            "bands": {"1": band(factor_1), "2": band(factor_2), "5-8": band(3.0, steps=3)},
            "prefill": {"alone": 9, "alone_token_s": 0.001, "shared": 9,
                        "shared_token_s": 0.001 * prefill, "factor": prefill}}


def test_served_factors_are_pooled_from_the_sweep_s_step_logs(tmp_path: Path, capsys) -> None:
    points = {"mixed 0.3/s": {**POINT, "rate": 0.3, "host_overlap": _overlap(1.2, 1.5, 1.1)},
              "mixed 0.5/s": {**POINT, "host_overlap": _overlap(1.4, None, 1.3)},
              "mixed 0.8/s": {**POINT, "rate": 0.8, "host_overlap": _overlap(0.9, 1.7, 1.2)}}
    served = served_overlaps({"summaries": {"colocated": {"mixed 0.5/s": POINT},
                                            "disagg": points}}, TWO_WORKERS)
    assert [(s, m, r) for s, m, r, _ in served] == [
        ("disagg", "mixed", 0.3), ("disagg", "mixed", 0.5), ("disagg", "mixed", 0.8)]
    # per band the median of the points' factors; a band with too few steps is left out
    sharing = host_sharing_of("served", served)
    assert sharing == HostSharing(((1, 1.2), (2, 1.6)), 1.2)
    assert host_sharing_of(None, served) is None
    assert host_sharing_of("2.0,1.5", served) == HostSharing(2.0, 1.5)
    with pytest.raises(ValueError, match="no step-log factors"):
        host_sharing_of("served", [])
    # by length: without shared prefill steps kept, the single factor stays
    prof = Profile.load(_profile(tmp_path / "p.json"))
    assert host_sharing_of("served-by-length", served, prof) == sharing
    # with them: the factor by prompt band, against the steps alone under serving
    step = prof.step
    for i, (_, _, _, overlap) in enumerate(served):
        alone = [[t, t, step.step_s(0, t, 0, t * (t + 1) // 2)] for t in (40 + i, 900 + i)]
        overlap["prefill"]["alone_steps"] = alone
        overlap["prefill"]["shared_steps"] = (
            [[t, c, 2.0 * s] for t, c, s in alone[:1]] * 2
            + [[t, c, 1.25 * s] for t, c, s in alone[1:]] * 2)
    by_length = host_sharing_of("served-by-length", served, prof)
    assert by_length is not None and by_length.decode_slowdown == sharing.decode_slowdown
    table = by_length.prefill_slowdown
    assert isinstance(table, tuple) and [t for t, _ in table] == [41, 901]
    assert [f for _, f in table] == pytest.approx([2.0, 1.25])
    with pytest.raises(ValueError, match="prefill profile"):
        host_sharing_of("served-by-length", served)
    served[0][3]["bands"]["1"]["alone_mean"] = {"rows": 1.0, "context": 100.0, "s": 0.02402}
    lines = profile_table(served, Profile.load(_profile(tmp_path / "p.json"))).splitlines()
    # the test profile's one-row step at 100 tokens of context: 10 + 2 + 0.01 ms
    assert len(lines) == 4 and lines[1].split()[3:] == ["2.00", "-", "-", "-", "-", "-", "-"]
    text = overlap_table(served).splitlines()
    assert len(text) == 4 and text[1].split()[3:] == [
        "40%", "/", "30%", "1.20", "1.50", "-", "-", "-", "-", "-", "1.10"]

    sweep = {"config": {"vocab": "1000,30000", "slo_ttft": 4.0, "slo_tpot": 0.25},
             "summaries": {"disagg": {"mixed 0.5/s": points["mixed 0.5/s"]}}}
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(sweep))
    prof = _profile(tmp_path / "p.json")
    assert main(["--sweep", str(path), "--prefill-profile", str(prof), "--decode-profile",
                 str(prof), "--host-sharing", "served", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "pooled: --host-sharing 1:1.40,1.30" in out and "served / the decode profile" in out
    saved = json.loads((tmp_path / "planner_validation.json").read_text())["host_sharing"]
    assert saved["flag"] == "1:1.40,1.30"


def _without_and_with_serving(tmp_path: Path, sweep: dict, prefill: Path, decode: Path
                              ) -> tuple[dict, list[str]]:
    """``sweep`` validated uncalibrated without and with ``--serving served``: each one's
    planner_validation.json by that flag's value (None, "served"), and the last arguments
    (``--out`` last)."""
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(sweep))
    figures = {}
    for serving in (None, "served"):
        out = tmp_path / str(serving)
        args = ["--sweep", str(path), "--prefill-profile", str(prefill), "--decode-profile",
                str(decode), "--calibrate", "none", "--out", str(out)]
        assert main(args + (["--serving", serving] if serving else [])) == 0
        figures[serving] = json.loads((out / "planner_validation.json").read_text())
    return figures, args


def test_served_steps_refit_the_disaggregated_workers_profiles(tmp_path: Path,
                                                                capsys) -> None:
    prof = _profile(tmp_path / "p.json")
    step = Profile.load(prof).step
    overlap = _overlap(1.2, None, 1.1)
    # decode alone: 1 row at 100 tokens of context profiles at 12.01 ms, 2 rows at 200 at
    # 14.02 ms; served 1.5x both
    overlap["bands"]["1"]["alone_mean"] = {"rows": 1.0, "context": 100.0, "s": 0.018015}
    overlap["bands"]["2"]["alone_mean"] = {"rows": 2.0, "context": 200.0, "s": 0.02103}
    # prefill alone: 100 and 400 fresh tokens profile at 110.005 and 410.08 ms; served
    # 1.2x plus 30 ms
    overlap["prefill"]["alone_steps"] = [[100, 100, 0.162006], [400, 400, 0.522096]]
    served = [("disagg", "mixed", 0.5, overlap)]
    base = Profile.load(prof)
    prefill, decode, fits = served_profiles(served, base, base)
    assert fits["decode"].scale == pytest.approx(1.5, rel=1e-3)
    assert fits["decode"].overhead_s == pytest.approx(0.0, abs=1e-5)
    assert fits["prefill"].scale == pytest.approx(1.2, rel=1e-3)
    assert fits["prefill"].overhead_s == pytest.approx(0.03, rel=1e-3)
    assert decode.step.step_s(4, 0, 900) == pytest.approx(1.5 * step.step_s(4, 0, 900), rel=1e-3)
    assert prefill.serving_step_s == pytest.approx(0.03, rel=1e-3)
    with pytest.raises(ValueError, match="no steps alone"):
        served_profiles([("disagg", "mixed", 0.5, _overlap(1.2, None, 1.1))], base, base)

    point = {**POINT, "host_overlap": overlap}
    sweep = {"config": {"vocab": "1000,30000", "slo_ttft": 4.0, "slo_tpot": 0.25},
             "summaries": {"disagg": {"mixed 0.5/s": point}, "colocated": {"mixed 0.5/s": POINT}}}
    figures, args = _without_and_with_serving(tmp_path, sweep, prof, prof)
    assert "served decode steps alone = profile x1.500 + 0.0 ms (40 steps)" in \
        capsys.readouterr().out
    assert figures[None]["serving"] == {}
    assert figures["served"]["serving"]["prefill"]["steps"] == 2
    by_setup = {k: {r["setup"]: r for r in figures[k]["rows"]} for k in figures}
    # the decode worker's steps are longer: so is every token gap it serves; the colocated
    # worker has no step logs and keeps its profile
    assert by_setup["served"]["disagg"]["tpot_p50"]["sim"] > \
        1.3 * by_setup[None]["disagg"]["tpot_p50"]["sim"]
    assert by_setup["served"]["colocated"]["tpot_p50"]["sim"] == \
        by_setup[None]["colocated"]["tpot_p50"]["sim"]
    # --served-from: the factors and fits from the points at one rate only
    out = tmp_path / "from"
    assert main(args[:-2] + ["--out", str(out), "--serving", "served", "--host-sharing",
                             "served", "--served-from", "0.5"]) == 0
    saved = json.loads((out / "planner_validation.json").read_text())
    assert saved["served_from"] == 0.5 and saved["serving"] == figures["served"]["serving"]
    with pytest.raises(SystemExit):  # no point at 0.9 req/s: nothing to take them from
        main(args + ["--serving", "served", "--served-from", "0.9"])
    # --served-sweep: the factors and fits from another run's sweep, here one whose decode
    # steps alone ran 2x their profile: the same points, predicted from it
    other = json.loads(json.dumps(sweep))
    bands = other["summaries"]["disagg"]["mixed 0.5/s"]["host_overlap"]["bands"]
    bands["1"]["alone_mean"]["s"] = 0.02402
    bands["2"]["alone_mean"]["s"] = 0.02804
    (tmp_path / "other.json").write_text(json.dumps(other))
    out = tmp_path / "other"
    assert main(args[:-2] + ["--out", str(out), "--serving", "served",
                             "--served-sweep", str(tmp_path / "other.json")]) == 0
    saved = json.loads((out / "planner_validation.json").read_text())
    assert saved["served_sweep"] == str(tmp_path / "other.json")
    assert saved["serving"]["decode"]["scale"] == pytest.approx(2.0, rel=1e-3)
    rows = {r["setup"]: r for r in saved["rows"]}
    assert rows["disagg"]["tpot_p50"]["sim"] > by_setup["served"]["disagg"]["tpot_p50"]["sim"]


def test_served_steps_refit_the_colocated_worker_s_profile(tmp_path: Path, capsys) -> None:
    """A colocated point's steps (all alone: one worker) fit its two-thread profile as the
    disaggregated decode worker's fit its one: decode steps a scale and an overhead, prompt
    steps a scale of their own; the disaggregated setups keep theirs."""
    pre, dec = _profile(tmp_path / "pre.json"), tmp_path / "dec.json"
    Profile(
        "m", "cpu: test", StepCost(0.02, 0.004, 0.002, 2e-7, 2e-9), Transfer(1e9, 0.002),
        kv_bytes_per_token=40_000, kv_capacity_tokens=20_000, chunk_tokens=2048,
        max_num_seqs=64).save(dec)
    step = Profile.load(pre).step
    overlap = {"decode_shared": 0.0, "prefill_shared": 0.0, "bands": {
        "1": {"alone": 30, "alone_mean": {"rows": 1.0, "context": 100.0,
                                          "s": 1.5 * step.step_s(1, 0, 100)}},
        "2": {"alone": 10, "alone_mean": {"rows": 2.0, "context": 300.0,
                                          "s": 1.5 * step.step_s(2, 0, 300)}}},
        # one 80-token prompt alone: 1.5 x 1.2 its profiled step
        "local_alone_steps": [[0, 80, 80, 1.8 * step.step_s(0, 80, 0, 80 * 81 // 2)]],
        "prefill": {"alone": 0, "shared": 0, "factor": None, "alone_steps": []}}
    chat = {**POINT, "mix": "chat", "decisions": {"local/colocated": 12}}
    sweep = {"config": {"vocab": "1000,30000", "slo_ttft": 4.0, "slo_tpot": 0.25},
             "summaries": {"colocated": {"chat 0.5/s": {**chat, "host_overlap": overlap}},
                           "disagg": {"chat 0.5/s": chat}}}
    figures, args = _without_and_with_serving(tmp_path, sweep, pre, dec)
    printed = capsys.readouterr().out
    assert "served colocated steps alone = profile x1.500 + 0.0 ms (40 steps)" in printed
    assert "the colocated worker's decode steps" in printed
    fits = figures["served"]["serving"]
    assert set(fits) == {"colocated", "colocated_prompt"}  # no disaggregated step logs
    assert fits["colocated_prompt"]["scale"] == pytest.approx(1.2, rel=1e-3)
    by_setup = {k: {r["setup"]: r for r in figures[k]["rows"]} for k in figures}
    assert by_setup["served"]["colocated"]["tpot_p50"]["sim"] > \
        1.3 * by_setup[None]["colocated"]["tpot_p50"]["sim"]
    assert by_setup["served"]["colocated"]["ttft_p50"]["sim"] > \
        1.6 * by_setup[None]["colocated"]["ttft_p50"]["sim"]
    assert by_setup["served"]["disagg"]["tpot_p50"] == by_setup[None]["disagg"]["tpot_p50"]
    # a sweep that kept no step logs has nothing to fit
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({**sweep, "summaries": {"colocated": {"chat 0.5/s": chat}}}))
    with pytest.raises(SystemExit):
        main([*args[:1], str(bare), *args[2:], "--serving", "served"])

    # its step logs from another sweep's file (--served-sweep): the fits are those
    assert main([*args[:1], str(bare), *args[2:], "--serving", "served",
                 "--served-sweep", args[1]]) == 0
    again = json.loads((tmp_path / "served" / "planner_validation.json").read_text())
    assert again["serving"] == fits
    assert again["served_sweep"] == args[1]


def test_handoff_takes_seconds_or_needs_a_placement_log(tmp_path: Path) -> None:
    """``--handoff SECONDS`` adds that much to the prefill profile's transfer latency;
    ``--handoff served`` needs a sweep whose router kept a placement log."""
    sweep = {"config": {"vocab": "1000,30000", "slo_ttft": 4.0, "slo_tpot": 0.25},
             "summaries": {"disagg": {"chat 0.5/s": {**POINT, "mix": "chat"}}}}
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(sweep))
    prof = _profile(tmp_path / "p.json")
    args = ["--sweep", str(path), "--prefill-profile", str(prof), "--decode-profile", str(prof),
            "--out", str(tmp_path)]
    with pytest.raises(SystemExit):  # no point has the real router's placement inputs
        main([*args, "--handoff", "served"])
    with pytest.raises(SystemExit):
        main([*args, "--handoff", "soon"])
    assert main([*args, "--handoff", "0.05"]) == 0
    saved = json.loads((tmp_path / "planner_validation.json").read_text())
    latency = Profile.load(prof).transfer.latency_s
    assert saved["prefill_transfer_latency_s"] == pytest.approx(latency + 0.05)
    assert saved["handoff"] == "0.05"
