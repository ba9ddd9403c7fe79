"""bench/serving/step_overlap.py: decode steps laid beside the prefill worker's, from step logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.serving.step_overlap import (
    MIN_STEPS,
    ServedFit,
    alone_ratios,
    decode_alone_pairs,
    decode_local_pairs,
    fit_served,
    host_overlap,
    main,
    mean_factor,
    overlaps,
    partly_factor,
    prefill_alone_pairs,
    prefill_length_table,
    served_fits,
    served_sharing,
)
from tandem.planner.profile import StepCost
from tandem.worker.step_log import StepRecord


def _d(start: float, seconds: float, rows: int, context: int = 0) -> StepRecord:
    return StepRecord(start, seconds, rows, 0, context)


def _p(start: float, seconds: float) -> StepRecord:
    return StepRecord(start, seconds, 0, 256)


def test_each_steps_share_of_time_under_the_others() -> None:
    prefill = [_p(1.0, 1.0), _p(2.5, 0.5)]
    decode = [_d(0.0, 0.5, 1), _d(0.5, 1.0, 1), _d(1.5, 1.0, 1), _d(3.5, 0.1, 1), _d(2.6, 0.2, 2)]
    assert overlaps(decode[:4], prefill) == pytest.approx([0.0, 0.5, 0.5 + 0.0, 0.0])
    assert overlaps(sorted(decode, key=lambda s: s.start), prefill) == pytest.approx(
        [0.0, 0.5, 0.5, 1.0, 0.0])
    # a step spanning two of the others, and one with no others at all
    assert overlaps([_d(0.5, 3.0, 1)], prefill) == pytest.approx([0.5])
    assert overlaps([_d(0.0, 1.0, 1)], []) == [0.0]


def test_the_factor_by_batch_size_is_shared_over_alone_medians() -> None:
    prefill = [_p(10.0, 10.0)]
    decode = ([_d(float(t), 0.02, 1) for t in range(5)]  # 1 row alone: 20 ms
              + [_d(10.0 + t, 0.05, 1) for t in range(5)]  # 1 row under the prefill: 50 ms
              + [_d(30.0 + t, 0.03 + 0.01 * t, 3, 300 + 30 * t) for t in range(3)]  # alone only
              + [_d(9.98, 0.04, 1)])  # half under: neither alone nor shared
    out = host_overlap(decode, prefill)
    one = out["bands"]["1"]
    assert (one["alone"], one["shared"]) == (5, 5)
    assert one["factor"] == pytest.approx(2.5)
    three = out["bands"]["3-4"]
    assert (three["alone"], three["shared"], three["factor"]) == (3, 0, None)
    assert three["alone_mean"] == pytest.approx({"rows": 3, "context": 330, "s": 0.04})
    assert set(out["bands"]) == {"1", "3-4"}
    decode_s = 5 * 0.02 + 5 * 0.05 + 3 * 0.04 + 0.04
    assert out["decode_shared"] == pytest.approx((5 * 0.05 + 0.02) / decode_s)
    assert out["prefill_shared"] == pytest.approx((5 * 0.05 + 0.02) / 10.0)
    # the one prefill step was under decode steps for 3% of its time: alone
    assert (out["prefill"]["alone"], out["prefill"]["shared"]) == (1, 0)
    assert out["prefill"]["alone_token_s"] == pytest.approx(10.0 / 256)


def test_the_mean_factor_keeps_the_tail_the_median_leaves_out() -> None:
    """A request's token gaps add its steps up: a factor of means reproduces the sum, one of
    medians misses the rare slow step (measured: 100-470 ms steps beside long prefills)."""
    prefill = [_p(100.0, 100.0)]
    alone = [_d(float(t), 0.02, 1, 100) for t in range(10)]
    shared = [_d(100.0 + t, 0.02, 1, 100) for t in range(9)] + [_d(120.0, 0.22, 1, 100)]
    band = host_overlap(alone + shared, prefill)["bands"]["1"]
    assert band["factor"] == pytest.approx(1.0)  # the median: as if nothing happened
    assert band["shared_mean"] == pytest.approx({"rows": 1, "context": 100, "s": 0.04})
    step = StepCost(0.01, 0.01, 0.001)  # 20 ms at one row, context ignored
    assert mean_factor(band, step) == pytest.approx(2.0)  # 10 steps took 0.4 s, not 0.2
    assert served_sharing([{"bands": {"1": band}, "prefill": host_overlap([], [])["prefill"]}],
                          step).decode_factor(1) == pytest.approx(2.0)
    assert served_sharing([{"bands": {"1": band}, "prefill": host_overlap([], [])["prefill"]}]
                          ).decode_factor(1) == pytest.approx(1.0)  # no profile: the medians
    del band["shared_mean"]  # an older sweep's log: no means
    assert mean_factor(band, step) is None


def test_the_prefill_factor_is_per_prompt_token() -> None:
    prefill = [_p(0.0, 1.0), StepRecord(2.0, 1.0, 0, 128), _p(4.0, 3.0)]
    decode = [_d(4.0, 3.0, 2)]
    out = host_overlap(decode, prefill)["prefill"]
    assert (out["alone"], out["shared"]) == (2, 1)
    # alone: 1/256 and 1/128 s a token (median 3/512); shared: 3/256
    assert out["factor"] == pytest.approx((3 / 256) / (3 / 512))
    # each step's shape is kept: the alone ones, and the shared one
    assert out["alone_steps"] == [[256, 0, 1.0], [128, 0, 1.0]]
    assert out["shared_steps"] == [[256, 0, 3.0]]


def test_only_pure_decode_steps_give_factors_but_every_step_counts_as_busy() -> None:
    # the decode worker's local prefill (prompt tokens, with or without rows) is busy time
    # but not a decode step; a prefill worker's step without prompt tokens is not its work
    local, mixed = _p(0.0, 1.0), StepRecord(1.0, 1.0, 2, 64)
    out = host_overlap([local, mixed, _d(2.0, 0.1, 4)],
                       [_d(0.5, 0.1, 1), _p(0.5, 0.5), _p(2.0, 0.1)])
    assert set(out["bands"]) == {"3-4"} and out["bands"]["3-4"]["shared"] == 1
    assert out["decode_shared"] == pytest.approx(0.6 / 2.1)
    assert out["prefill_shared"] == pytest.approx(1.0)


def test_a_sweep_s_points_are_recomputed_from_the_logs_it_kept(tmp_path: Path) -> None:
    logs = tmp_path / "steps-disagg"
    logs.mkdir()
    (logs / "decode.jsonl").write_text(
        '{"start": 10.0, "s": 0.01, "rows": 1, "tokens": 0, "context": 40}\n')
    (logs / "prefill.jsonl").write_text(
        '{"start": 11.0, "s": 0.2, "rows": 0, "tokens": 256, "context": 256}\n')
    # a colocated setup logs one worker's steps: all of them alone
    (tmp_path / "steps-colocated").mkdir()
    (tmp_path / "steps-colocated" / "decode.jsonl").write_text(
        '{"start": 10.0, "s": 0.01, "rows": 1, "tokens": 0, "context": 40}\n'
        '{"start": 10.1, "s": 0.1, "rows": 1, "tokens": 80, "context": 121}\n')
    sweep = {"summaries": {
        "disagg": {"chat 0.3/s": {"host_overlap": {"bands": {}, "window": [0.0, 1e12]}}},
        "colocated": {"chat 0.3/s": {"host_overlap": {"bands": {}, "window": [0.0, 1e12]}},
                      "chat 0.8/s": {"ttft": {}}}}}  # an older sweep's point: no window
    path = tmp_path / "serve_sweep.json"
    path.write_text(json.dumps(sweep))
    assert main([str(path)]) == 0
    out = json.loads(path.read_text())["summaries"]
    o = out["disagg"]["chat 0.3/s"]["host_overlap"]
    assert o["window"] == [0.0, 1e12] and o["bands"]["1"]["alone_mean"]["context"] == 40
    c = out["colocated"]["chat 0.3/s"]["host_overlap"]
    assert c["bands"]["1"]["alone"] == 1 and c["local_alone_steps"] == [[1, 80, 121, 0.1]]
    assert c["decode_shared"] == 0.0 and c["prefill"]["alone_steps"] == []
    assert out["colocated"]["chat 0.8/s"] == {"ttft": {}}


def test_bench_serve_gives_a_colocated_point_its_steps_alone(tmp_path: Path) -> None:
    """A colocated setup's one worker logs its steps and no prefill worker's: its point
    still gets a ``host_overlap``, every step alone (its served fits read them)."""
    from bench.serving.logs import read_point_logs
    from scripts import bench_serve

    (tmp_path / "decode.jsonl").write_text(
        '{"start": 10.0, "s": 0.01, "rows": 2, "tokens": 0, "context": 90}\n'
        '{"start": 10.1, "s": 0.1, "rows": 0, "tokens": 64, "context": 64}\n'
        '{"start": 99.0, "s": 0.01, "rows": 1, "tokens": 0, "context": 40}\n')  # not its window
    window = (9.0, 11.0)
    got = bench_serve.log_summaries(read_point_logs(tmp_path, *window), window, [])
    overlap = got["host_overlap"]
    assert overlap["window"] == [9.0, 11.0] and list(overlap["bands"]) == ["2"]
    assert overlap["bands"]["2"]["alone"] == 1 and overlap["bands"]["2"]["shared"] == 0
    assert overlap["local_alone_steps"] == [[0, 64, 64, 0.1]]
    assert "prefill_residuals" not in got and "placement_inputs" not in got
    assert bench_serve.log_summaries(read_point_logs(tmp_path / "none", *window), window,
                                     []) == {}


def test_steps_alone_are_set_beside_the_profile_s_step_at_their_mean_shape() -> None:
    # the profile: 10 ms + 2 ms a row + 1 us a context token
    step = StepCost(0.01, 0.002, 0.001, 1e-6)

    def band(alone: int, rows: float, context: float, s: float) -> dict:
        return {"alone": alone, "alone_mean": {"rows": rows, "context": context, "s": s}}

    one = {"bands": {"1": band(40, 1, 1000, 0.0143),        # 13 ms profiled: 1.1x
                     "3-4": band(20, 3.5, 2000, 0.02375),   # 19 ms: 1.25x
                     "5-8": band(MIN_STEPS - 1, 6, 0, 1.0),  # too few steps alone
                     "2": {"alone": 0, "alone_s": None}},    # no step alone at all
           "prefill": {"alone": 0}}
    assert alone_ratios(one, step) == pytest.approx({"1": 1.1, "3-4": 1.25})
    pairs = decode_alone_pairs(one, step)
    assert [p[2] for p in pairs] == [40, 20]
    assert [v for p in pairs for v in p[:2]] == pytest.approx([0.013, 0.0143, 0.019, 0.02375])
    assert prefill_alone_pairs(one, step) == []


def test_a_prefill_step_alone_is_set_beside_the_simulator_s_step() -> None:
    step = StepCost(0.01, 0.0, 0.001, 1e-6, 1e-7)
    overlap = {"bands": {}, "prefill": {"alone_steps": [[100, 100, 0.2], [50, 150, 0.1]]}}
    # fresh: 10 + 100 ms + 5050 pairs; after 100 cached tokens: 10 + 50 + (5000 + 1275) pairs
    pairs = prefill_alone_pairs(overlap, step)
    assert [v for p in pairs for v in p] == pytest.approx(
        [0.11 + 5050e-7, 0.2, 1, 0.06 + 6275e-7, 0.1, 1])


def test_served_steps_are_fitted_as_a_scale_and_an_overhead() -> None:
    exact = [(x, 1.3 * x + 0.02, n) for x, n in ((0.1, 3), (0.5, 1), (2.0, 2))]
    fit = fit_served(exact)
    assert (fit.scale, fit.overhead_s, fit.steps) == pytest.approx((1.3, 0.02, 6))
    assert fit.flag() == "x1.300 + 20.0 ms (6 steps)"
    # a negative intercept is not an overhead: refitted through the origin
    fit = fit_served([(0.01, 0.009, 10), (0.02, 0.022, 10)])
    assert fit.overhead_s == 0.0
    assert fit.scale == pytest.approx((0.01 * 0.009 + 0.02 * 0.022) / (0.01**2 + 0.02**2))
    # the weights count: the many short steps set the line
    weighted = fit_served([(0.01, 0.011, 100), (0.02, 0.022, 100), (1.0, 3.0, 1)])
    assert weighted.scale < fit_served([(0.01, 0.011, 1), (0.02, 0.022, 1), (1.0, 3.0, 1)]).scale
    assert fit_served([(0.01, 0.011, 5)]) is None and fit_served([]) is None
    points = [{"bands": {"1": {"alone": 10, "alone_mean": {"rows": 1, "context": 0,
                                                            "s": 0.024}},
                         "2": {"alone": 10, "alone_mean": {"rows": 2, "context": 0,
                                                            "s": 0.028}}},
               "prefill": {"alone_steps": []}}]
    fits = served_fits(points, StepCost(0.01, 0.002, 0.001), StepCost(0.01, 0.002, 0.001))
    # profiled 12 and 14 ms, served 24 and 28: twice as long
    assert fits["decode"].scale == pytest.approx(2.0) and fits["prefill"] is None


def test_the_decode_worker_s_local_prefills_alone_get_their_own_scale() -> None:
    """Its decode steps alone set its served fit, its steps with a local prompt a scale of
    their own on top (``serving_prompt_scale``): the two kinds stray from the profile apart
    (measured: prompt steps ~0.9x the profile and decode steps 1.05x, or 1.28x and 0.96x),
    and one line through both priced each kind wrong."""
    step = StepCost(0.01, 0.002, 0.001)
    prefill = [_p(10.0, 1.0)]
    decode = ([_d(float(t) / 10, 0.024, 1) for t in range(20)]  # 2x the profile's 12 ms
              + [StepRecord(20.0, 0.112, 1, 100, 130),  # 1 row + a 100-token prompt, alone
                 StepRecord(10.2, 0.5, 1, 100, 130)])  # the same beside a prefill: left out
    overlap = host_overlap(decode, prefill)
    assert overlap["local_alone_steps"] == [[1, 100, 130, 0.112]]
    # profiled 12 + 100 (its tokens) = 112 ms, served 112: the same
    assert decode_local_pairs(overlap, step) == [(pytest.approx(0.112), 0.112, 1)]
    fits = served_fits([overlap], step, step)
    assert fit_served(decode_alone_pairs(overlap, step)) is None  # one band: no slope
    # so its decode steps give a scale alone: 12 -> 24 ms; its prompt step then runs at
    # half of what that scale gives it (112 against 2 x 112 ms)
    assert (fits["decode"].scale, fits["decode"].overhead_s) == pytest.approx((2.0, 0.0))
    assert (fits["prompt"].scale, fits["prompt"].steps) == pytest.approx((0.5, 1))
    # with no decode step alone the prompt steps are all the fit has
    only_local = {**overlap, "bands": {}}
    assert served_fits([only_local], step, step)["decode"].scale == pytest.approx(1.0)
    assert served_fits([only_local], step, step)["prompt"] is None


def test_the_prefill_factor_by_length_is_against_the_steps_alone_under_serving() -> None:
    """Each shared step over the alone model at its shape, pooled by prompt band: short
    prompts slowed 2x, mid ones 1.5x, long ones 1.1x; a band with too few steps gives none,
    and a factor under 1 counts as 1."""
    step = StepCost(0.01, 0.0, 0.001)  # no attention cost: a step is 10 ms + 1 ms a token
    fit = ServedFit(1.2, 0.005, 100)

    def alone(tokens: int) -> float:
        return 1.2 * (0.01 + 0.001 * tokens) + 0.005

    short = [[t, t, 2.0 * alone(t)] for t in (20, 30, 40, 50)]
    mid = [[t, t, 1.5 * alone(t)] for t in (100, 200, 150, 120, 250)]
    long = [[t, t, 1.1 * alone(t)] for t in (1500, 1800, 2000, 1200)]
    fast = [[600, 600, 0.9 * alone(600)] for _ in range(4)]
    few = [[300, 300, 3.0 * alone(300)]]  # with `fast`: the 257-1024 band's median is 0.9
    points = [{"prefill": {"shared_steps": short + mid[:2]}},
              {"prefill": {"shared_steps": mid[2:] + long + fast + few}},
              {"prefill": {}}]  # a point from before the steps were kept
    table = prefill_length_table(points, step, fit)
    assert table is not None
    assert [t for t, _ in table] == [35, 150, 600, 1650]
    assert [f for _, f in table] == pytest.approx([2.0, 1.5, 1.0, 1.1])
    # without a fit the steps are set against the profile's own step
    bare = prefill_length_table(points, step, None)
    assert bare is not None and bare[0][1] == pytest.approx(2.0 * alone(35) / 0.045, rel=0.05)
    assert prefill_length_table([{"prefill": {"shared_steps": short[:3]}}], step, fit) is None


def test_a_step_partly_under_decode_steps_gives_the_factor_its_time_implies() -> None:
    """The simulator slows a prefill step's work by the factor while its peer steps, so a
    step ``ratio`` times its time alone with ``share`` of it shared implies one factor:
    1/ratio = 1 - share + share/factor."""
    assert partly_factor(1.5, 1.0) == pytest.approx(1.5)
    # half of a 1.25x step's served time shared: 0.8 = 0.5 + 0.5/f, f = 5/3
    assert partly_factor(1.25, 0.5) == pytest.approx(5 / 3)
    assert partly_factor(2.5, 0.5) is None  # twice its time alone at most with half shared
    step = StepCost(0.01, 0.0, 0.001)
    fit = ServedFit(1.0, 0.0, 100)
    alone = 0.01 + 0.001 * 900
    partly = [[900, 900, 1.25 * alone, 0.5] for _ in range(4)]
    table = prefill_length_table([{"prefill": {"shared_steps": [], "partly_steps": partly}}],
                                 step, fit)
    assert table is not None and len(table) == 1
    assert table[0][0] == 900 and table[0][1] == pytest.approx(5 / 3)
    # the log keeps a step between half and 95% shared with its share
    prefill = [StepRecord(0.0, 1.0, 0, 900)]
    decode = [_d(0.0, 0.3, 1), _d(0.3, 0.3, 1)]  # 60% of it
    assert host_overlap(decode, prefill)["prefill"]["partly_steps"] == [[900, 0, 1.0, 0.6]]
