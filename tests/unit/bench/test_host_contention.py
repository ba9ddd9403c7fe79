"""bench/serving/host_contention.py: the phases' medians and the slowdowns read off them."""

from __future__ import annotations

import argparse
import sys

import pytest

from bench.serving import host_contention
from bench.serving.host_contention import analyse, sharing
from tandem.planner.sim.host import HostSharing


def test_phases_are_split_by_time_and_straddling_steps_left_out() -> None:
    s = 4.0
    # decode: 10 ms steps alone until s, 25 ms while the prefill runs (s .. 3s)
    decode = [(0.3 + 0.01 * i, 0.01) for i in range(300)]  # ends 0.30 .. 3.29
    decode += [(s + 0.1, 0.2)]  # straddles the phase start: left out
    decode += [(s + 0.5 + 0.025 * i, 0.025) for i in range(200)]
    # prefill: 1.5 s with decode (the one started at 2s + 3.5 ends past 3s: left out), then
    # 1 s alone
    prefill = [(s, 1.5), (s + 1.5, 1.5), (s + 3.0, 1.5), (2 * s + 3.5, 1.5),
               (3 * s + 0.5, 1.0), (3 * s + 1.5, 1.0)]
    out = analyse(decode, prefill, s)
    assert out["decode_step_s"]["alone"] == pytest.approx(0.01)
    assert out["decode_step_s"]["with_prefill"] == pytest.approx(0.025)
    assert out["decode_slowdown"] == pytest.approx(2.5)
    assert out["prefill_s"]["prompts"] == [2, 3]
    assert out["prefill_slowdown"] == pytest.approx(1.5)


def test_a_phase_without_a_complete_step_is_an_error() -> None:
    with pytest.raises(ValueError, match="--seconds"):
        analyse([(1.0, 0.01)], [(9.0, 1.0)], 2.0)


def test_the_flag_holds_the_decode_factor_by_rows_and_the_mean_prefill_factor() -> None:
    runs = [{"rows": 8, "decode_slowdown": 1.9, "prefill_slowdown": 1.7},
            {"rows": 1, "decode_slowdown": 2.4, "prefill_slowdown": 1.9},
            {"rows": 32, "decode_slowdown": 0.97, "prefill_slowdown": 1.6}]  # noise: 1
    model = sharing(runs)
    assert model.decode_slowdown == ((1, 2.4), (8, 1.9), (32, 1.0))
    assert model.prefill_slowdown == pytest.approx(1.6 + 0.4 / 3)
    assert model.flag() == "1:2.40/8:1.90/32:1.00,1.73"
    assert sharing(runs[:1]) == HostSharing(1.9, 1.7)


def test_each_role_is_pinned_as_bench_serve_pins_it(monkeypatch) -> None:
    started: list[list[str]] = []

    def popen(argv: list[str], **_: object) -> list[str]:
        started.append(argv)
        return argv

    monkeypatch.setattr(host_contention.subprocess, "Popen", popen)
    monkeypatch.setattr(host_contention.os, "sched_getaffinity", lambda _: {0, 1})
    args = argparse.Namespace(rows=2, model="m", seconds=1.0, prompt=64, decode_threads=1,
                              prefill_threads=2)
    host_contention._child("decode", args)
    host_contention._child("prefill", args)  # two threads: on every core
    host_contention._child("prefill", argparse.Namespace(**{**vars(args), "prefill_threads": 1}))
    assert [argv[:3] for argv in started] == [
        ["taskset", "-c", "1"], [sys.executable, "-m", "bench.serving.host_contention"],
        ["taskset", "-c", "0"]]
