"""``tandem plan`` end to end: profiles (file or datasheet), workload, outputs, bad input."""

from __future__ import annotations

import json
from pathlib import Path

from tandem.cli.plan import main
from tandem.planner.profile import Profile, StepCost, Transfer
from tandem.planner.trace import TraceRequest, write_jsonl


def _profile_file(tmp_path: Path) -> Path:
    p = Profile("m", "cpu: test", StepCost(0.01, 0.001, 0.0002, 1e-8),
                Transfer(1e9, 0.002), kv_bytes_per_token=20_000, kv_capacity_tokens=60_000,
                chunk_tokens=1024, max_num_seqs=32)
    path = tmp_path / "p.json"
    p.save(path)
    return path


def test_plan_from_a_measured_profile_writes_json_plot_and_values(tmp_path: Path,
                                                                   capsys) -> None:
    out = tmp_path / "out"
    rc = main(["--profile", str(_profile_file(tmp_path)), "--workload", "chat", "--rate", "2",
               "--duration", "30", "--slo-ttft", "2", "--slo-tpot", "0.1", "--quiet",
               "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "deploy:" in printed and "tandem up --prefill" in printed
    data = json.loads((out / "plan.json").read_text())
    assert data["inputs"]["requests"] > 0
    assert data["chosen"] is not None
    assert data["chosen"] in (data["disaggregated"], data["colocated"])
    assert (out / "plan.png").stat().st_size > 1000
    assert "replicas:" in (out / "values.yaml").read_text()


def test_plan_from_a_datasheet_roofline(capsys) -> None:
    rc = main(["--device", "H200", "--model", "Llama-3.1-8B", "--workload", "mixed",
               "--scale", "4", "--rate", "10", "--duration", "20", "--quiet",
               "--slo-ttft", "2", "--slo-tpot", "0.05"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "--prefill-gpus 1" in printed or "--decode-gpus 1" in printed


def test_plan_replays_a_trace_file(tmp_path: Path, capsys) -> None:
    trace = tmp_path / "t.jsonl"
    write_jsonl(trace, [TraceRequest(i * 0.5, 64 + i % 7, 16) for i in range(40)])
    rc = main(["--profile", str(_profile_file(tmp_path)), "--trace", str(trace), "--quiet"])
    assert rc == 0
    assert "config" in capsys.readouterr().out


def test_bad_inputs_are_refused_with_a_reason(tmp_path: Path, capsys) -> None:
    assert main(["--workload", "chat", "--rate", "1", "--quiet"]) == 2
    assert "--profile" in capsys.readouterr().err
    assert main(["--device", "L40S", "--model", "Llama-3.1-70B", "--gpus-per-worker", "1",
                 "--rate", "1", "--quiet"]) == 2
    assert "fit" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "other"}')
    assert main(["--profile", str(bad), "--rate", "1", "--quiet"]) == 2
    assert "profile" in capsys.readouterr().err
    assert main(["--profile", str(_profile_file(tmp_path)), "--workload", "nope",
                 "--rate", "1", "--quiet"]) == 2
    assert "--workload" in capsys.readouterr().err


def test_plan_on_a_link_says_when_disaggregation_stops_paying(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    rc = main(["--profile", str(_profile_file(tmp_path)), "--workload", "mixed", "--rate", "1",
               "--duration", "30", "--quiet", "--link-gbps", "0.5", "--link-rtt-ms", "2",
               "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    # 20,000 B a token at 62.5 MB/s: 320 ms per 1k tokens
    assert "link 0.5 Gb/s, RTT 2 ms: a push costs 320.0 ms per 1k prompt tokens" in printed
    assert "beside 1 decoding stream(s):" in printed and "Gb/s a " in printed
    link = json.loads((out / "plan.json").read_text())["inputs"]["link"]
    assert link["gbps"] == 0.5 and link["rtt_s"] == 0.002
    assert [v["decode_rows"] for v in link["verdicts"]] == [1, 16]
    assert main(["--profile", str(_profile_file(tmp_path)), "--rate", "1", "--quiet",
                 "--link-rtt-ms", "1"]) == 2
    assert "--link-gbps" in capsys.readouterr().err
    assert main(["--profile", str(_profile_file(tmp_path)), "--rate", "1", "--quiet",
                 "--link-gbps", "0"]) == 2
