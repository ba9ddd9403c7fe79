"""bench/planner_validation.py: the simulated point replays the real point's requests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.planner_validation import TWO_WORKERS, add_sensitivity, compare, main, trace_of
from bench.step_overlap import overlap_table
from bench.validation_inputs import host_sharing_of, served_overlaps, served_profiles
from bench.validation_tables import KEYS, profile_table, table, within, worker_table
from tandem.loadgen.workload import MIXES, make_requests
from tandem.planner.profile import Profile, StepCost, Transfer
from tandem.planner.sim.host import HostSharing
from tandem.router.handoff.placement import Slo

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


DOCS = Path(__file__).resolve().parents[3] / "docs" / "bench"


def test_run_10_keeps_the_figures_it_predicted_within_15_percent(tmp_path: Path) -> None:
    """The committed run (profiles, host contention and sweep measured on one VM state;
    docs/planner.md): the simulator must keep predicting at least as many of its figures
    within 15% as it did when they were recorded (45 of 75; 8 of the colocated setup's 10
    chat figures), so a change to the simulator that loses agreement with real runs fails
    here. 44 since the simulated workers' fits start from the engine's start-up warm-up
    (tandem/common/warmup_plan.py; runs 14-16 gained 1-2 figures each with it)."""
    flag = json.loads((DOCS / "host_contention.json").read_text())["host_sharing"]
    assert main(["--sweep", str(DOCS / "serve_sweep_run10.json"),
                 "--prefill-profile", str(DOCS / "profile_smollm2_cpu2_run10.json"),
                 "--decode-profile", str(DOCS / "profile_smollm2_cpu1_run10.json"),
                 "--host-sharing", flag, "--out", str(tmp_path)]) == 0
    rows = [r for r in json.loads((tmp_path / "planner_validation.json").read_text())["rows"]
            if not r["calibration"]]
    assert len(rows) == 15
    within = {(r["setup"], r["mix"], r["rate"], k) for r in rows for k in KEYS
              if abs(r[k]["ratio"] - 1) <= 0.15}
    assert len(within) >= 44
    colocated_chat = {(s, m, rate, k) for s, m, rate, k in within
                      if s == "colocated" and m == "chat"}
    assert len(colocated_chat) >= 8


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


@pytest.mark.parametrize(("run", "prefill", "sharing", "least"), [
    (14, "cpu1_run14", "served", 36), (15, "cpu2_run15", "served", 24),
    (16, "cpu2_run16", "served-by-length", 36)])
def test_runs_14_to_16_keep_their_figures_with_served_steps(
        tmp_path: Path, run: int, prefill: str, sharing: str, least: int) -> None:
    """Runs 14 (a core per worker), 15 and 16 (the 2-thread prefill worker sharing the
    decode worker's core), with the host factors and served steps their own step logs
    measured (docs/planner.md): at least as many figures within 15% as recorded with the
    simulator's fitted signals and transfer timeout (run 14 had 37 before the timeout: its
    always-remote mixed load at 1.4 req/s now falls back to local prefill 8 times where the
    real router did 3, and that point's TTFT p90 goes from 1.11x to 1.37x). Run 16 kept its
    shared prefill steps' shapes: its prefill factor is by prompt length (28 with the one
    factor). Since the simulated workers' fits start from the engine's start-up warm-up
    (tandem/common/warmup_plan.py): 38, 25 and 34 (36, 24 and 32 before); since the router also
    learns the decode worker's local overhead (tandem/router/handoff/placement.py,
    PrefillOverheads), run 16's 32 (its simulated chat load then goes remote a little more
    often: 8 against 13 local of 60 at 1.4 req/s with the one factor); since the decode
    factors are ratios of means and the decode worker's served fit takes in its local
    prefills (bench/step_overlap.py, run 23), 30 (36 with the first alone); since the
    simulated router reads the workers' queues a report old (tandem/planner/sim/reports.py) and the
    decode worker's prompt steps have a served scale of their own (stop 41), 36, 24 and 36."""
    assert main(["--sweep", str(DOCS / f"serve_sweep_run{run}.json"),
                 "--prefill-profile", str(DOCS / f"profile_smollm2_{prefill}.json"),
                 "--decode-profile", str(DOCS / "profile_smollm2_cpu1_run14.json"),
                 "--host-sharing", sharing, "--serving", "served",
                 "--out", str(tmp_path)]) == 0
    rows = [r for r in json.loads((tmp_path / "planner_validation.json").read_text())["rows"]
            if not r["calibration"]]
    assert len(rows) == 10
    assert sum(abs(r[k]["ratio"] - 1) <= 0.15 for r in rows for k in KEYS) >= least


def _local(row: dict, side: str) -> float:
    decisions = row[f"{side}_decisions"]
    return decisions.get("local/slo", 0) + decisions.get("local/cheapest", 0)


def test_run_20_s_handoff_gap_brings_the_chat_placement_in_line(tmp_path: Path) -> None:
    """Run 20 logged the real router's placement inputs: it learnt a remote overhead of
    52-77 ms for chat prompts where the simulated router learnt 22-25 ms, so the real one
    kept most chat prompts local (37 / 55 / 29 of 60) where the simulated one kept 19 / 22 /
    9. ``--handoff served`` adds the gap to the prefill profile's transfer latency (+38 ms;
    +36 with run 23's served factors): the simulated chat placement then follows the real
    one within 12 prompts of 60 at every
    rate (48 / 46 / 32; docs/planner.md, run 20); 13 since the learnt overheads fade without
    new observations (PrefillOverheads; 42 at 0.8 req/s); 15 since stop 41's queues a report
    old and served prompt-step scale (40 at 0.8 req/s; the gap +40 ms). Run 21 found most of
    that gap was the prefill worker's fit error, which the router now corrects on both
    options alike."""
    args = ["--sweep", str(DOCS / "serve_sweep_run20.json"),
            "--prefill-profile", str(DOCS / "profile_smollm2_cpu2_run16.json"),
            "--decode-profile", str(DOCS / "profile_smollm2_cpu1_run14.json"),
            "--host-sharing", "served", "--serving", "served"]
    rows = {}
    for name, extra in (("without", []), ("with", ["--handoff", "served"])):
        assert main([*args, *extra, "--out", str(tmp_path / name)]) == 0
        saved = json.loads((tmp_path / name / "planner_validation.json").read_text())
        rows[name] = {r["rate"]: r for r in saved["rows"]
                      if r["mix"] == "chat" and not r["calibration"]}
        rows[name + " saved"] = saved
    assert rows["with saved"]["prefill_transfer_latency_s"] == pytest.approx(0.040, abs=2e-3)
    def gap(row: dict) -> float:
        return abs(_local(row, "sim") - _local(row, "real"))

    assert max(gap(row) for row in rows["without"].values()) > 30  # the gap it closes
    for rate, row in rows["with"].items():
        assert gap(row) <= 15, rate
        seen = row["placement_inputs"]
        assert seen["real"]["chat"]["overhead_s"] > 0.04 and seen["sim"]["chat"] is not None


def test_handoff_takes_seconds_or_needs_a_placement_log(tmp_path: Path) -> None:
    args = ["--sweep", str(DOCS / "serve_sweep_run19.json"),
            "--prefill-profile", str(DOCS / "profile_smollm2_cpu2_run16.json"),
            "--decode-profile", str(DOCS / "profile_smollm2_cpu1_run14.json"),
            "--out", str(tmp_path)]
    with pytest.raises(SystemExit):  # run 19's router kept no placement log
        main([*args, "--handoff", "served"])
    with pytest.raises(SystemExit):
        main([*args, "--handoff", "soon"])
    assert main([*args, "--handoff", "0.05"]) == 0
    saved = json.loads((tmp_path / "planner_validation.json").read_text())
    latency = Profile.load(DOCS / "profile_smollm2_cpu2_run16.json").transfer.latency_s
    assert saved["prefill_transfer_latency_s"] == pytest.approx(latency + 0.05)


def _served_rows(tmp_path: Path, run: int) -> list[dict]:
    """An adaptive-only run (19 on) simulated with run 16's profiles and the served
    factors: its non-calibration rows."""
    assert main(["--sweep", str(DOCS / f"serve_sweep_run{run}.json"),
                 "--prefill-profile", str(DOCS / "profile_smollm2_cpu2_run16.json"),
                 "--decode-profile", str(DOCS / "profile_smollm2_cpu1_run14.json"),
                 "--host-sharing", "served", "--serving", "served",
                 "--out", str(tmp_path)]) == 0
    return [r for r in json.loads((tmp_path / "planner_validation.json").read_text())["rows"]
            if not r["calibration"]]


def test_run_21_keeps_its_figures_with_both_sides_overheads_learnt(tmp_path: Path) -> None:
    """Run 21: the real and the simulated router learn the decode worker's local overhead as
    they learn a prefill worker's remote one (tandem/router/handoff/placement.py, PrefillOverheads),
    so neither option carries its worker's fit error alone. With the served factors 16 of 25
    figures within 15% (run 20: 9), 15 since the learnt overheads fade without new
    observations, 14 since stop 41 (queues a report old, a served prompt-step scale), and
    the chat load's placement at 0.8 req/s follows the real router's without ``--handoff``
    (local 24 real, 24 simulated, of 60 (26 since stop 41); run 20: 55 and 18;
    docs/planner.md, run 21)."""
    rows = _served_rows(tmp_path, 21)
    assert len(rows) == 5
    assert sum(abs(r[k]["ratio"] - 1) <= 0.15 for r in rows for k in KEYS) >= 14
    chat = {r["rate"]: r for r in rows if r["mix"] == "chat"}
    assert abs(_local(chat[0.8], "sim") - _local(chat[0.8], "real")) <= 5
    seen = chat[0.8]["placement_inputs"]
    assert seen["real"]["chat"]["local_overhead_s"] > 0.0


def test_run_22_with_fading_overheads_keeps_the_chat_placement(tmp_path: Path) -> None:
    """Run 22: run 21 again with the learnt overheads fading (the real router as it is now):
    15 of 25 figures within 15% with the served factors (14 since stop 41), and the chat
    load's local placements within 5 of 60 of the real router's at 0.8 and 1.4 req/s (20 /
    20 and 16 / 12; since stop 41 20 / 23 and 16 / 12; docs/planner.md, run 22)."""
    rows = _served_rows(tmp_path, 22)
    assert sum(abs(r[k]["ratio"] - 1) <= 0.15 for r in rows for k in KEYS) >= 14
    for row in rows:
        if row["mix"] == "chat":
            assert abs(_local(row, "sim") - _local(row, "real")) <= 5, row["rate"]


def test_run_23_with_workers_that_answer_stats_mid_step(tmp_path: Path) -> None:
    """Run 23: the workers answer Stats while a step runs (tandem/engine/async_engine.py), so the
    real router reads the prefill worker's fit within a probe of its first long prefill
    (3.3 ms a token 2 s after it; run 22 kept 1.2 for 20 s). With the decode factors as
    ratios of means, the decode worker's local prefills in its served fit and the prefill
    factor by length from the steps partly under decode steps too (all
    bench/step_overlap.py), 17 of 25 figures within 15% by prompt length (docs/planner.md,
    run 23); 20 since stop 41 (queues a report old, a served prompt-step scale)."""
    assert main(["--sweep", str(DOCS / "serve_sweep_run23.json"),
                 "--prefill-profile", str(DOCS / "profile_smollm2_cpu2_run16.json"),
                 "--decode-profile", str(DOCS / "profile_smollm2_cpu1_run14.json"),
                 "--host-sharing", "served-by-length", "--serving", "served",
                 "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "planner_validation.json").read_text())
    rows = [r for r in saved["rows"] if not r["calibration"]]
    assert sum(abs(r[k]["ratio"] - 1) <= 0.15 for r in rows for k in KEYS) >= 20
    mixed = {r["rate"]: r for r in rows if r["mix"] == "mixed"}
    # what the real router read of the prefill worker at the mixed load: its served cost
    assert mixed[0.8]["placement_inputs"]["real"]["all"]["prefill_per_token_s"] > 0.003


def _own_and_predicted(tmp_path: Path, run: int, profiles: tuple[str, str], previous: int,
                       least_own: int, least_predicted: int) -> None:
    """Run ``run``'s sweep by prompt length with served steps: at least ``least_own`` of 25
    figures within 15% with its own served factors, ``least_predicted`` with ``previous``'s
    (``--served-sweep``). profiles: the prefill and decode profiles' run labels."""
    args = ["--sweep", str(DOCS / f"serve_sweep_run{run}.json"),
            "--prefill-profile", str(DOCS / f"profile_smollm2_cpu2_run{profiles[0]}.json"),
            "--decode-profile", str(DOCS / f"profile_smollm2_cpu1_run{profiles[1]}.json"),
            "--host-sharing", "served-by-length", "--serving", "served"]
    for name, extra, least in (("own", [], least_own), (f"from {previous}", [
            "--served-sweep", str(DOCS / f"serve_sweep_run{previous}.json")], least_predicted)):
        assert main([*args, *extra, "--out", str(tmp_path / name)]) == 0
        saved = json.loads((tmp_path / name / "planner_validation.json").read_text())
        rows = [r for r in saved["rows"] if not r["calibration"]]
        assert sum(abs(r[k]["ratio"] - 1) <= 0.15 for r in rows for k in KEYS) >= least, name


def test_run_24_predicted_from_run_23(tmp_path: Path) -> None:
    """Run 24: run 23's code and commands an hour later. With its own served factors 16 of
    25 figures within 15% by prompt length; predicted from run 23's (``--served-sweep``),
    14 (docs/planner.md, run 23); since stop 41 (queues a report old, a served prompt-step
    scale) 18 and 18."""
    _own_and_predicted(tmp_path, 24, ("16", "14"), 23, 18, 18)


def test_run_25_on_profiles_of_the_faster_kernels(tmp_path: Path) -> None:
    """Run 25: run 24's commands on new profiles of both workers (the one-row decode loop of
    stop 39, stop 40's prefill attention tiles and row passes). With its own served factors
    21 of 25 figures within 15% by prompt length; predicted from run 24's, 19
    (docs/planner.md, run 25); since stop 41 (queues a report old, a served prompt-step
    scale) 20 and 19."""
    _own_and_predicted(tmp_path, 25, ("25", "25"), 24, 20, 19)


def test_run_26_repeats_run_25(tmp_path: Path) -> None:
    """Run 26: run 25's sweep half an hour later on the same profiles: 21 of 25 figures within
    15% by prompt length with its own served factors again; 18 predicted from run 25's
    (docs/planner.md, run 25). Since stop 41 19 and 14: run 26's steps ran slower than run
    25's served fits say, which the one decode fit's 1.07x (its decode steps priced 12% too
    dear) had covered."""
    _own_and_predicted(tmp_path, 26, ("25", "25"), 25, 19, 14)


def test_run_27_on_profiles_with_the_rows_that_ran(tmp_path: Path) -> None:
    """Run 27: new profiles of both workers from the fixed profiler (its decode samples
    count the rows that ran: the decode worker's cost per context token 5.1 us where run
    25's profile had 1.0) and run 25's sweep on them, with the simulated router reading
    queues a report old and the decode worker's prompt steps scaled apart (stop 41): 22 of
    25 figures within 15% by prompt length with its own served factors, 18 with run 26's
    step logs set against these profiles (docs/planner.md, run 27)."""
    _own_and_predicted(tmp_path, 27, ("27", "27"), 26, 22, 18)


def test_run_28_colocated_on_current_kernels(tmp_path: Path) -> None:
    """Run 28: the colocated setup (one worker, two threads, prefilling its own prompts) on a
    fresh two-thread profile, its first validation since runs 10-13: 13 of 25 figures within
    15% on its profile as measured, calibrated at the chat load's 0.3 req/s as those were;
    20 with its served fits (its kept step log's steps over windows recovered from the
    router's placement log: decode steps 1.07x the profile, prompt steps 1.01x that;
    docs/planner.md, run 28)."""
    args = ["--sweep", str(DOCS / "serve_sweep_run28.json"),
            "--prefill-profile", str(DOCS / "profile_smollm2_cpu2_run28.json"),
            "--decode-profile", str(DOCS / "profile_smollm2_cpu1_run27.json")]
    for name, extra, least in (("measured", [], 13), ("served", ["--serving", "served"], 20)):
        assert main([*args, *extra, "--out", str(tmp_path / name)]) == 0
        saved = json.loads((tmp_path / name / "planner_validation.json").read_text())
        rows = [r for r in saved["rows"] if not r["calibration"]]
        assert {r["setup"] for r in rows} == {"colocated"} and len(rows) == 5
        assert within(rows, 0.15) >= least, name
    assert saved["serving"]["colocated"]["scale"] == pytest.approx(1.069, abs=0.001)


def _within_by_setup(out: Path) -> dict[str, int]:
    """Figures within 15% per setup in a planner_validation.json (calibration left out)."""
    counts: dict[str, int] = {}
    for r in json.loads((out / "planner_validation.json").read_text())["rows"]:
        if not r["calibration"]:
            counts[r["setup"]] = counts.get(r["setup"], 0) + within([r], 0.15)
    return counts


def test_run_29_both_setups_with_their_served_fits(tmp_path: Path) -> None:
    """Run 29: both setups in one sweep on one pair of fresh profiles, every point's steps
    kept (the colocated worker's too): with their own served fits 23 of 25 figures within
    15% for the disaggregated setup and 19 for the colocated one; predicted from run 27's
    step logs (the disaggregated workers' fits; the colocated worker then runs on its
    profile as measured) 24 and 17 (docs/planner.md, run 29)."""
    args = ["--sweep", str(DOCS / "serve_sweep_run29.json"),
            "--prefill-profile", str(DOCS / "profile_smollm2_cpu2_run29.json"),
            "--decode-profile", str(DOCS / "profile_smollm2_cpu1_run29.json"),
            "--host-sharing", "served-by-length", "--serving", "served"]
    assert main([*args, "--out", str(tmp_path / "own")]) == 0
    own = _within_by_setup(tmp_path / "own")
    assert own["disagg"] >= 23 and own["colocated"] >= 19, own
    assert main([*args, "--served-sweep", str(DOCS / "serve_sweep_run27.json"),
                 "--out", str(tmp_path / "from27")]) == 0
    predicted = _within_by_setup(tmp_path / "from27")
    assert predicted["disagg"] >= 24 and predicted["colocated"] >= 17, predicted


def test_run_30_repeats_run_29_and_is_predicted_from_it(tmp_path: Path) -> None:
    """Run 30: run 29's sweep again right after it, on the same profiles. With its own served
    fits 21 of 25 figures within 15% (disaggregated) and 20 (colocated); predicted from run
    29's step logs, 21 and 20 as well, where run 30 reproduces run 29's own figures on 22 and
    13 (bench/sweep_repeat; docs/planner.md, run 30)."""
    args = ["--sweep", str(DOCS / "serve_sweep_run30.json"),
            "--prefill-profile", str(DOCS / "profile_smollm2_cpu2_run29.json"),
            "--decode-profile", str(DOCS / "profile_smollm2_cpu1_run29.json"),
            "--host-sharing", "served-by-length", "--serving", "served"]
    for name, extra in (("own", []), ("from29", [
            "--served-sweep", str(DOCS / "serve_sweep_run29.json")])):
        assert main([*args, *extra, "--out", str(tmp_path / name)]) == 0
        counts = _within_by_setup(tmp_path / name)
        assert counts["disagg"] >= 21 and counts["colocated"] >= 20, (name, counts)
