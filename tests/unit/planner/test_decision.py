"""tandem/planner/decision.py: ``tandem plan`` deploys what it argues for. For a tie that
colocation wins on headroom, a split that wins on GPUs and a colocated pool that wins on GPUs,
the verdict, the table's marker, plan.json's ``chosen``, the printed ``tandem up`` line (parsed
by ``tandem up``'s own parser) and the rendered chart's replica counts name one configuration."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from tandem.planner.decision import decide
from tandem.planner.profile import Profile, StepCost, Transfer
from tandem.planner.search import Candidate, Plan
from tandem.planner.sim.results import Summary
from tandem.planner.sizing import Sizing
from tandem.planner.trace import TraceRequest, write_jsonl


def _summary(attainment: float = 0.95) -> Summary:
    return Summary(requests=100, completed=100, ttft_p50_s=0.2, ttft_p90_s=0.5, ttft_p99_s=0.9,
                   tpot_p50_s=0.02, tpot_p90_s=0.03, tpot_p99_s=0.05, e2e_p50_s=2.0,
                   e2e_p90_s=3.0, e2e_p99_s=4.0, itl_max_p99_s=0.1, output_tokens_per_s=900.0,
                   requests_per_s=10.0, slo_attainment=attainment, goodput_rps=9.5,
                   decisions={}, migrations=0, pushed_bytes=0, wall_s=0.1, simulated_s=60.0)


def _split(p: int, d: int, goodput: float) -> Candidate:
    return Candidate("disaggregated", p, d, p + d, _summary(), True, goodput)


def _colo(n: int, goodput: float) -> Candidate:
    return Candidate("colocated", 0, n, n, _summary(), True, goodput)


def _plan(split: Candidate | None, colo: Candidate | None) -> Plan:
    evaluated = [c for c in (split, colo) if c is not None]
    return Plan(10.0, Sizing(2, 2, 4, 1e4, 1e3, 32), split, colo, evaluated, 2, 0.1)


# (name, the plan, what must be deployed: (kind, prefill, decode))
CASES = [
    ("tie, colocation has more headroom", _plan(_split(2, 2, 55.5), _colo(4, 57.1)),
     ("colocated", 0, 4)),
    ("tie, the split has more headroom", _plan(_split(2, 2, 60.0), _colo(4, 57.1)),
     ("disaggregated", 2, 2)),
    ("the split needs fewer GPUs", _plan(_split(1, 2, 30.0), _colo(4, 80.0)),
     ("disaggregated", 1, 2)),
    ("the colocated pool needs fewer GPUs", _plan(_split(2, 3, 90.0), _colo(4, 40.0)),
     ("colocated", 0, 4)),
    ("only a colocated pool is feasible", _plan(None, _colo(3, 20.0)), ("colocated", 0, 3)),
]


@pytest.mark.parametrize(("name", "plan", "want"), CASES, ids=[c[0] for c in CASES])
def test_the_decision_picks_by_gpus_then_headroom(name: str, plan: Plan,
                                                  want: tuple[str, int, int]) -> None:
    decision = decide(plan)
    assert decision.chosen is not None
    assert (decision.chosen.kind, decision.chosen.prefill, decision.chosen.decode) == want
    other = plan.colocated if decision.chosen is plan.disaggregated else plan.disaggregated
    assert decision.runner_up is other


def test_no_feasible_configuration_deploys_nothing() -> None:
    decision = decide(_plan(None, None))
    assert decision.chosen is None and "No configuration" in decision.reason


def _profile_file(tmp_path: Path) -> Path:
    p = Profile("m", "H200", StepCost(0.01, 0.001, 0.0002, 1e-8), Transfer(1e9, 0.002),
                kv_bytes_per_token=20_000, kv_capacity_tokens=60_000, chunk_tokens=1024,
                max_num_seqs=32, gpus_per_worker=1)
    path = tmp_path / "p.json"
    p.save(path)
    return path


def _printed_up_line(printed: str) -> list[str]:
    lines = printed.splitlines()
    at = lines.index("deploy:")
    return shlex.split(lines[at + 1].strip())


def _chart_replicas(values_yaml: str, mode: str) -> dict[str, int]:
    """Workers per role that the chart, rendered with the plan's values, starts."""
    from tests.helm import chart

    values = {"mode": mode, "model": {"name": "smollm2"}, **yaml.safe_load(values_yaml)}
    objs = chart.objects(chart.render(values))
    if mode == "deployments":  # a role without a Deployment runs no worker
        return {"prefill": 0, "decode": 0} | {
            d["metadata"]["name"].rsplit("-", 1)[1]: d["spec"]["replicas"]
            for d in chart.by_kind(objs, "Deployment")
            if d["metadata"]["name"].endswith(("-prefill", "-decode"))}
    from tandem.launcher.up import build_parser

    head = next(p for p in chart.processes(objs) if p.command == "up")
    args = build_parser().parse_args(head.argv)
    (cluster,) = chart.by_kind(objs, "RayCluster")
    groups = {g["groupName"] for g in cluster["spec"]["workerGroupSpecs"]}
    assert groups == {role for role in ("prefill", "decode") if getattr(args, role)}, groups
    return {"prefill": args.prefill, "decode": args.decode}


@pytest.mark.parametrize(("name", "plan", "want"), CASES, ids=[c[0] for c in CASES])
def test_every_output_of_tandem_plan_names_the_chosen_configuration(
    name: str, plan: Plan, want: tuple[str, int, int], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    from tandem.cli import plan as plan_command
    from tandem.launcher.up import build_parser
    from tandem.planner import search

    monkeypatch.setattr(search, "plan", lambda *a, **k: plan)  # the search is tested elsewhere
    trace = tmp_path / "t.jsonl"
    write_jsonl(trace, [TraceRequest(i * 0.5, 64, 16) for i in range(8)])
    out = tmp_path / "out"
    rc = plan_command.main(["--profile", str(_profile_file(tmp_path)), "--trace", str(trace),
                            "--slo-ttft", "2", "--slo-tpot", "0.05", "--quiet",
                            "--out", str(out)])
    assert rc == 0
    kind, prefill, decode = want
    printed = capsys.readouterr().out
    # the verdict
    decision = decide(plan)
    assert decision.reason in printed
    said = ("colocated" if decision.reason.startswith("Colocated wins")
            or decision.reason.endswith("so colocate.") else "disaggregated")
    assert said == kind
    # the table's marker
    marked = [line for line in printed.splitlines() if line.startswith("*")]
    assert len(marked) == 1 and marked[0][1:].split()[:3] == [kind, str(prefill), str(decode)]
    # plan.json
    data = json.loads((out / "plan.json").read_text())
    chosen = data["chosen"]
    assert (chosen["kind"], chosen["prefill"], chosen["decode"]) == want
    assert data["verdict"] == decision.reason
    # the printed command, through tandem up's own parser
    argv = _printed_up_line(printed)
    assert argv[:2] == ["tandem", "up"]
    args = build_parser().parse_args(argv[2:])
    assert (args.prefill, args.decode) == (prefill, decode)
    assert any("--slo-ttft-s=2" in a for a in args.router_arg)
    # the chart, rendered with values.yaml, in both modes
    values = (out / "values.yaml").read_text()
    for mode in ("ray", "deployments"):
        assert _chart_replicas(values, mode) == {"prefill": prefill, "decode": decode}, mode
