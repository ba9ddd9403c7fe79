"""A plan as people read it: a table, JSON, Helm values and ``tandem up`` flags."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from tandem.placement.slo import Slo
from tandem.planner.decision import Decision
from tandem.planner.profile import Profile
from tandem.planner.search import Candidate, Plan

MARK = "*"  # the table's marker on the configuration the decision deploys


def _row(c: Candidate, chosen: Candidate | None) -> str:
    s = c.summary
    good = f"{c.goodput_rps:8.2f}" if c.goodput_rps is not None else "       -"
    mark = MARK if c is chosen else " "
    return (f"{mark}{c.kind:13s} {c.prefill:5d} {c.decode:5d} {c.gpus:6d} "
            f"{s.slo_attainment:8.1%} {s.ttft_p90_s:8.3f} {s.tpot_p90_s * 1e3:8.1f} "
            f"{s.output_tokens_per_s:10.0f} {good}")


HEADER = (f" {'config':13s} {'P':>5s} {'D':>5s} {'GPUs':>6s} {'attain':>8s} {'TTFT p90':>8s} "
          f"{'TPOT p90':>8s} {'out tok/s':>10s} {'goodput':>8s}\n"
          f" {'':13s} {'':>5s} {'':>5s} {'':>6s} {'':>8s} {'s':>8s} {'ms':>8s} {'':>10s} "
          f"{'req/s':>8s}")


def table(plan: Plan, decision: Decision, top: int = 8) -> str:
    """The winners first (``*`` on the one ``decision`` deploys), then the cheapest other
    evaluated configurations."""
    lines = [HEADER]
    shown = [c for c in (plan.disaggregated, plan.colocated) if c is not None]
    lines += [_row(c, decision.chosen) for c in shown]
    rest = [c for c in plan.evaluated if all(c is not s for s in shown)][:top]
    if rest:
        lines.append("  (other configurations simulated at the target rate)")
        lines += [_row(c, decision.chosen) for c in rest]
    if decision.chosen is not None:
        lines.append(f"  ({MARK}: the configuration to deploy)")
    return "\n".join(lines)


def up_flags(c: Candidate, prefill: Profile, decode: Profile, slo: Slo) -> str:
    """``tandem up`` flags that deploy ``c`` (a colocated pool: no prefill workers), with the
    router's SLO targets; a worker of several GPUs is a tensor-parallel group of that size
    (``--prefill-arg=--tensor-parallel-size=N``: one rank per GPU)."""
    router = (f"--router-arg=--slo-ttft-s={slo.ttft_s:g} "
              f"--router-arg=--slo-tpot-s={slo.tpot_s:g}")
    if c.kind == "colocated":
        return (f"tandem up --prefill 0 --decode {c.decode} "
                f"{_role_flags('decode', decode)}{router}")
    return (f"tandem up --prefill {c.prefill} --decode {c.decode} "
            f"{_role_flags('prefill', prefill)}{_role_flags('decode', decode)}{router}")


def _role_flags(role: str, profile: Profile) -> str:
    gpus = profile.gpus_per_worker
    group = f"--{role}-arg=--tensor-parallel-size={gpus} " if gpus > 1 else ""
    return f"--{role}-gpus {gpus} {group}"


def helm_values(c: Candidate, prefill: Profile, decode: Profile, slo: Slo) -> str:
    """A values.yaml fragment for deploy/helm/tandem that deploys ``c`` (an
    ``accelerator.count`` above 1 makes each worker a tensor-parallel group of that size)."""
    gpu = "cpu" if decode.device.lower().startswith("cpu") else "cuda"

    def pool(name: str, replicas: int, profile: Profile) -> str:
        count = profile.gpus_per_worker if gpu == "cuda" else 0
        return (f"{name}:\n  replicas: {replicas}\n  minReplicas: {replicas}\n"
                f"  maxReplicas: {replicas}\n  device: {gpu}\n"
                f"  accelerator:\n    count: {count}\n")

    router = ("router:\n  extraArgs:\n"
              f"    - --slo-ttft-s={slo.ttft_s:g}\n    - --slo-tpot-s={slo.tpot_s:g}\n")
    prefill_replicas = c.prefill if c.kind == "disaggregated" else 0  # colocated: no pool
    return (f"# tandem plan: {c.kind}, {c.gpus} GPUs, attainment "
            f"{c.summary.slo_attainment:.1%} at the planned rate\n"
            + router + pool("prefill", prefill_replicas, prefill) + pool("decode", c.decode, decode))


def to_json(plan: Plan, decision: Decision, inputs_summary: dict[str, Any]) -> dict[str, Any]:
    """The whole plan as JSON: inputs, the chosen configuration and why, both winners with
    curves, everything simulated."""
    def cand(c: Candidate | None) -> dict[str, Any] | None:
        return None if c is None else asdict(c)

    return {
        "inputs": inputs_summary,
        "rate": plan.rate,
        "sizing": asdict(plan.sizing),
        "chosen": cand(decision.chosen),
        "verdict": decision.reason,
        "disaggregated": cand(plan.disaggregated),
        "colocated": cand(plan.colocated),
        "evaluated": [asdict(c) for c in plan.evaluated],
        "simulations": plan.simulations,
        "wall_s": plan.wall_s,
    }
