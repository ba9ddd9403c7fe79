"""A plan as people read it: a table, JSON, Helm values and ``tandem up`` flags."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from tandem.placement.slo import Slo
from tandem.planner.profile import Profile
from tandem.planner.search import Candidate, Plan


def _row(c: Candidate) -> str:
    s = c.summary
    good = f"{c.goodput_rps:8.2f}" if c.goodput_rps is not None else "       -"
    return (f"{c.kind:13s} {c.prefill:5d} {c.decode:5d} {c.gpus:6d} {s.slo_attainment:8.1%} "
            f"{s.ttft_p90_s:8.3f} {s.tpot_p90_s * 1e3:8.1f} {s.output_tokens_per_s:10.0f} {good}")


HEADER = (f"{'config':13s} {'P':>5s} {'D':>5s} {'GPUs':>6s} {'attain':>8s} {'TTFT p90':>8s} "
          f"{'TPOT p90':>8s} {'out tok/s':>10s} {'goodput':>8s}\n"
          f"{'':13s} {'':>5s} {'':>5s} {'':>6s} {'':>8s} {'s':>8s} {'ms':>8s} {'':>10s} "
          f"{'req/s':>8s}")


def table(plan: Plan, top: int = 8) -> str:
    """The winners first, then the cheapest other evaluated configurations."""
    lines = [HEADER]
    shown = [c for c in (plan.best, plan.colocated) if c is not None]
    lines += [_row(c) for c in shown]
    rest = [c for c in plan.evaluated if all(c is not s for s in shown)][:top]
    if rest:
        lines.append("  (other configurations simulated at the target rate)")
        lines += [_row(c) for c in rest]
    return "\n".join(lines)


def verdict(plan: Plan) -> str:
    """One paragraph: what to deploy, and whether disaggregation pays for this workload."""
    b, c = plan.best, plan.colocated
    if b is None and c is None:
        return ("No configuration the search tried meets the SLO at this rate: relax the "
                "targets, lower the rate, or give it a faster profile.")
    if b is None:
        return (f"Colocated wins: {c.decode} workers ({c.gpus} GPUs) meet the SLO; no "
                "disaggregated split the search tried does.")
    if c is None:
        return (f"Disaggregated wins: P={b.prefill} + D={b.decode} ({b.gpus} GPUs) meet the "
                "SLO; no colocated pool the search tried does.")
    split = f"P={b.prefill} + D={b.decode}"
    if b.gpus == c.gpus:
        head = (f"A tie on GPUs: {split} and {c.decode} colocated workers both need {b.gpus}. "
                f"Headroom decides: goodput {b.goodput_rps or 0:.3g} vs "
                f"{c.goodput_rps or 0:.3g} req/s, so ")
        return head + ("disaggregate." if (b.goodput_rps or 0) > (c.goodput_rps or 0)
                       else "colocate.")
    if c.gpus < b.gpus:
        return (f"Colocated wins: {c.decode} workers ({c.gpus} GPUs) meet the SLO, where the "
                f"cheapest disaggregated split needs {b.gpus} GPUs ({split}).")
    return (f"Disaggregated wins: {split} ({b.gpus} GPUs), {1 - b.gpus / c.gpus:.0%} fewer "
            f"GPUs than colocated ({c.decode} workers, {c.gpus} GPUs).")


def up_flags(c: Candidate, prefill: Profile, decode: Profile, slo: Slo) -> str:
    """``tandem up`` flags that deploy ``c``."""
    if c.kind == "colocated":
        return f"tandem up --prefill 0 --decode {c.decode} --decode-gpus {decode.gpus_per_worker}"
    return (f"tandem up --prefill {c.prefill} --decode {c.decode} "
            f"--prefill-gpus {prefill.gpus_per_worker} --decode-gpus {decode.gpus_per_worker} "
            f"--router-arg=--slo-ttft-s={slo.ttft_s:g} --router-arg=--slo-tpot-s={slo.tpot_s:g}")


def helm_values(c: Candidate, prefill: Profile, decode: Profile, slo: Slo) -> str:
    """A values.yaml fragment for deploy/helm/tandem that deploys ``c``."""
    gpu = "cpu" if decode.device.lower().startswith("cpu") else "cuda"

    def pool(name: str, replicas: int, profile: Profile) -> str:
        count = profile.gpus_per_worker if gpu == "cuda" else 0
        return (f"{name}:\n  replicas: {replicas}\n  minReplicas: {replicas}\n"
                f"  maxReplicas: {replicas}\n  device: {gpu}\n"
                f"  accelerator:\n    count: {count}\n")

    router = ("router:\n  extraArgs:\n"
              f"    - --slo-ttft-s={slo.ttft_s:g}\n    - --slo-tpot-s={slo.tpot_s:g}\n")
    prefill_replicas = c.prefill if c.kind == "disaggregated" else 0
    return (f"# tandem plan: {c.kind}, {c.gpus} GPUs, attainment "
            f"{c.summary.slo_attainment:.1%} at the planned rate\n"
            + router + pool("prefill", prefill_replicas, prefill) + pool("decode", c.decode, decode))


def to_json(plan: Plan, inputs_summary: dict[str, Any]) -> dict[str, Any]:
    """The whole plan as JSON (inputs, winners with curves, everything simulated)."""
    def cand(c: Candidate | None) -> dict[str, Any] | None:
        return None if c is None else asdict(c)

    return {
        "inputs": inputs_summary,
        "rate": plan.rate,
        "sizing": asdict(plan.sizing),
        "best": cand(plan.best),
        "colocated": cand(plan.colocated),
        "evaluated": [asdict(c) for c in plan.evaluated],
        "simulations": plan.simulations,
        "wall_s": plan.wall_s,
        "verdict": verdict(plan),
    }
