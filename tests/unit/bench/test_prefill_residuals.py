"""bench/serving/prefill_residuals.py: a placed prefill's measured time split against its prediction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.serving.prefill_residuals import main, match_decisions, point_residuals, sweep_residuals
from tandem.worker.step_log import StepRecord

T0 = 1_000.0  # the router's clock at the point's start; the client's sent_at counts from it


def _remote(t: float, tokens: int, reason: str = "slo") -> dict:
    # The prefill worker's fit: 10 ms + 1 ms a token; 20 ms of learnt overhead on top.
    return {"t": t, "tokens": tokens, "decision": "remote", "reason": reason, "endpoint": "p",
            "local": {"ttft_s": 1.0, "gap_s": 0.1, "overhead_s": 0.0},
            "decode": {"endpoint": "d", "base_s": 0.02, "per_row_s": 0.002,
                       "per_token_s": 0.0006, "cached": 0},
            "prefill": [{"endpoint": "p", "base_s": 0.01, "per_token_s": 0.001, "queued": 0,
                         "cached": 0, "overhead_s": 0.02,
                         "ttft_s": 0.01 + 0.001 * tokens + 0.02, "gap_s": 0.02}]}


def _local(t: float, tokens: int) -> dict:
    record = _remote(t, tokens)
    record |= {"decision": "local", "endpoint": ""}
    record["local"] = {"ttft_s": 0.06, "gap_s": 0.08, "overhead_s": 0.01}
    return record


def _request(sent_at: float, tokens: int, ttft: float, ok: bool = True) -> dict:
    return {"sent_at": sent_at, "prompt_tokens": tokens, "ttft": ttft, "ok": ok}


def test_a_remote_and_a_local_prefill_split_into_wait_step_and_after() -> None:
    placements = [_remote(T0, 100), _local(T0 + 1.0, 50)]
    records = [_request(0.0, 100, 0.16), _request(1.0, 50, 0.075)]
    prefill = [StepRecord(T0 + 0.002, 0.15, 0, 100)]
    decode = [StepRecord(T0 + 0.5, 0.01, 2, 0), StepRecord(T0 + 1.001, 0.07, 2, 50)]
    got = point_residuals(records, placements, prefill, decode)
    assert got is not None
    remote, local = got["remote"], got["local"]
    assert remote["n"] == 1 and local["n"] == 1
    # measured 0.16 s against the compute the decision predicted (0.13 - 0.02 learnt)
    assert remote["residual_s"] == pytest.approx(0.05)
    assert remote["wait_s"] == pytest.approx(0.002)
    assert remote["step_s"] == pytest.approx(0.15)
    assert remote["step_over_fit"] == pytest.approx(0.15 / 0.11)
    assert remote["after_s"] == pytest.approx(0.16 - 0.152)
    # local: 0.075 s against 0.06 - 0.01; its step beside 2 rows against D's fit for it
    assert local["residual_s"] == pytest.approx(0.025)
    assert local["step_over_fit"] == pytest.approx(0.07 / (0.02 + 2 * 0.002 + 50 * 0.0006))
    assert local["after_s"] == pytest.approx(1.075 - 1.071)


def test_two_requests_decided_in_the_other_order_still_match() -> None:
    placements = [_remote(T0, 90), _remote(T0 + 0.001, 79)]
    records = [_request(0.0, 79, 0.2), _request(0.0005, 90, 0.3)]
    pairs = match_decisions(records, placements)
    assert [(p["tokens"], r["prompt_tokens"]) for p, r in pairs] == [(79, 79), (90, 90)]
    assert match_decisions(records, placements + [_remote(T0 + 2, 40)]) == []
    assert point_residuals(records[:1], placements, [], []) is None


def test_only_the_model_s_decisions_of_chat_sized_prompts_count() -> None:
    placements = [_remote(T0, 100, reason="no_signal"), _remote(T0 + 1, 900),
                  _remote(T0 + 2, 60)]
    records = [_request(0.0, 100, 0.2), _request(1.0, 900, 1.0), _request(2.0, 60, 0.1)]
    got = point_residuals(records, placements, [], [])
    assert got is not None and got["remote"]["n"] == 1 and got["local"]["n"] == 0
    assert got["remote"]["residual_s"] == pytest.approx(0.1 - 0.07)
    assert got["remote"]["step_s"] is None  # no step log line for it
    every = point_residuals(records, placements, [], [], max_tokens=None)
    assert every is not None and every["remote"]["n"] == 2
    failed = [_request(0.0, 100, 0.2), _request(1.0, 900, 1.0), _request(2.0, 60, 0.1, ok=False)]
    got = point_residuals(failed, placements, [], [])
    assert got is not None and got["remote"]["n"] == 0


def _sweep_folder(tmp_path: Path, with_records: bool = True) -> Path:
    window = [T0 - 1, T0 + 10]
    sweep: dict = {"summaries": {"disagg": {"chat 0.3/s": {"host_overlap": {"window": window}},
                                            "chat 0.8/s": {}}}}
    if with_records:
        sweep["records"] = {"disagg": {"chat 0.3/s": [_request(0.0, 100, 0.16)],
                                       "chat 0.8/s": []}}
    (tmp_path / "serve_sweep.json").write_text(json.dumps(sweep))
    steps = tmp_path / "steps-disagg"
    steps.mkdir()
    (steps / "router_placements.jsonl").write_text(json.dumps(_remote(T0, 100)) + "\n")
    line = {"start": T0 + 0.002, "s": 0.15, "rows": 0, "tokens": 100, "context": 100}
    (steps / "prefill.jsonl").write_text(json.dumps(line) + "\n")
    (steps / "decode.jsonl").write_text("")
    return tmp_path


def test_a_sweep_folder_gives_each_point_s_figures(tmp_path: Path, capsys) -> None:
    folder = _sweep_folder(tmp_path)
    got = sweep_residuals(folder)
    assert got["chat 0.8/s"] is None  # no window recorded
    point = got["chat 0.3/s"]
    assert point is not None and point["remote"]["residual_s"] == pytest.approx(0.05)
    assert main([str(folder), "--json", str(tmp_path / "out.json")]) == 0
    out = capsys.readouterr().out
    assert "chat 0.3/s     remote    1" in out and "1.36" in out, out
    assert json.loads((tmp_path / "out.json").read_text())["chat 0.3/s"]["remote"]["n"] == 1


def test_a_sweep_without_records_is_refused(tmp_path: Path, capsys) -> None:
    assert main([str(_sweep_folder(tmp_path, with_records=False))]) == 2
    assert "no per-request records" in capsys.readouterr().err


def test_bench_serve_stores_each_point_s_residuals_from_its_logs(tmp_path: Path) -> None:
    """scripts/bench_serve reads the same logs per point (its window) into the summary's
    ``prefill_residuals``; a setup without the logs has none."""
    from bench.serving.logs import read_point_logs
    from scripts import bench_serve

    steps = _sweep_folder(tmp_path) / "steps-disagg"
    records = [_request(0.0, 100, 0.16)]
    window = (T0 - 1, T0 + 10)
    got = bench_serve.log_summaries(read_point_logs(steps, *window), window,
                                    records)["prefill_residuals"]
    assert got is not None and got["remote"]["residual_s"] == pytest.approx(0.05)
    assert got["remote"]["step_over_fit"] == pytest.approx(0.15 / 0.11)
    none = bench_serve.log_summaries(read_point_logs(tmp_path / "none", *window), window,
                                     records)
    assert "prefill_residuals" not in none
