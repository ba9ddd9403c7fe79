"""Does the simulator predict real runs? planner/sim against bench/serve's sweep, point by point.

    python -m bench.planner_validation --sweep docs/bench/serve_sweep.json \\
        --prefill-profile docs/bench/profile_smollm2_cpu2.json \\
        --decode-profile docs/bench/profile_smollm2_cpu1.json --out docs/bench

For every (setup, mix, rate) point of a sweep that ``scripts/bench_serve --sweep`` ran, the
same requests (bench/serve_workload.make_requests with the point's seed: the same arrival
times and lengths the real run sent) are simulated on the same deployment:

    disagg          1 prefill + 1 decode worker, adaptive placement, the run's SLO
    disagg-remote   the same, every prompt remote
    colocated       1 worker prefilling its own prompts

with the profiles ``tandem profile`` measured for the roles' thread counts (prefill and
colocated workers: 2 threads; decode: 1). It prints sim / real for TTFT p50/p90, TPOT
p50/p90 and output tokens/s, and whether each is within ``--tolerance`` (15%). Multi-turn
points are skipped: their turns are sent when the previous reply ends (a closed loop), which
the simulator's open-loop traces do not model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.serve_workload import MIXES, make_requests
from planner.profile import Profile
from planner.sim import ClusterSpec, simulate
from planner.trace import TraceRequest
from router.handoff.placement import Slo

METRICS = (("ttft_p50", "ttft", "p50", "ttft_p50_s"), ("ttft_p90", "ttft", "p90", "ttft_p90_s"),
           ("tpot_p50", "tpot", "p50", "tpot_p50_s"), ("tpot_p90", "tpot", "p90", "tpot_p90_s"))
SETUPS = {"disagg": (1, "adaptive"), "disagg-remote": (1, "remote"), "colocated": (0, "local")}


def trace_of(point: dict[str, Any], vocab: tuple[int, int], scale: float) -> list[TraceRequest]:
    """The requests the real run sent at this point, as a trace."""
    specs = make_requests(MIXES[point["mix"]], point["rate"], point["requests"],
                          seed=point["seed"], vocab=vocab, scale=scale)
    return [TraceRequest(s.arrival_s, len(s.prompt_ids), s.max_tokens, s.kind) for s in specs]


def compare(setup: str, point: dict[str, Any], trace: list[TraceRequest], prefill: Profile,
            decode: Profile, slo: Slo) -> dict[str, Any]:
    """Simulate one point and set its figures beside the real ones."""
    pools, placement = SETUPS[setup]
    spec = ClusterSpec(pools, 1, placement=placement, slo=slo)
    if pools:
        result = simulate(spec, decode, trace, prefill_profile=prefill)
    else:
        result = simulate(spec, prefill, trace)  # the colocated worker owns both cores
    sim = result.summary(slo)
    row: dict[str, Any] = {"setup": setup, "mix": point["mix"], "rate": point["rate"],
                           "requests": len(trace), "sim_decisions": sim.decisions,
                           "real_decisions": point.get("decisions", {})}
    for name, group, pct, attr in METRICS:
        row[name] = {"real": point[group][pct], "sim": getattr(sim, attr)}
    row["output_tok_s"] = {"real": point["output_tok_s"], "sim": sim.output_tokens_per_s}
    row["attainment"] = {"real": point["attainment"], "sim": sim.slo_attainment}
    for key in [m[0] for m in METRICS] + ["output_tok_s"]:
        v = row[key]
        v["ratio"] = v["sim"] / v["real"] if v["real"] > 0 else float("inf")
    return row


def table(rows: list[dict[str, Any]], tolerance: float) -> str:
    """sim/real per metric, a * where outside the tolerance."""
    keys = [m[0] for m in METRICS] + ["output_tok_s"]
    head = f"{'setup':14s} {'mix':6s} {'rate':>5s} " + " ".join(f"{k:>13s}" for k in keys) \
        + f" {'attain real/sim':>16s}"
    lines = [head]
    for r in rows:
        cells = []
        for k in keys:
            ratio = r[k]["ratio"]
            cells.append(f"{ratio:12.2f}{'*' if abs(ratio - 1) > tolerance else ' '}")
        a = r["attainment"]
        lines.append(f"{r['setup']:14s} {r['mix']:6s} {r['rate']:5.2f} " + " ".join(cells)
                     + f" {a['real']:7.0%} / {a['sim']:4.0%}")
    within = sum(abs(r[k]["ratio"] - 1) <= tolerance for r in rows for k in keys)
    lines.append(f"within {tolerance:.0%}: {within} of {len(rows) * len(keys)} figures "
                 "(* marks the others; ratio = simulated / measured)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep", type=Path, required=True, help="serve_sweep.json of a real run")
    p.add_argument("--prefill-profile", type=Path, required=True,
                   help="profile of the prefill and colocated workers (2 threads)")
    p.add_argument("--decode-profile", type=Path, required=True,
                   help="profile of the decode worker (1 thread)")
    p.add_argument("--tolerance", type=float, default=0.15)
    p.add_argument("--out", type=Path, default=None, help="write planner_validation.json here")
    args = p.parse_args(argv)
    sweep = json.loads(args.sweep.read_text())
    # a sweep's own file has its "config"; docs/bench/serve_sweep.json merges "runs"
    run_args = sweep["config"] if "config" in sweep else next(iter(sweep["runs"].values()))
    vocab = tuple(int(x) for x in run_args["vocab"].split(","))
    slo = Slo(run_args["slo_ttft"], run_args["slo_tpot"])
    prefill, decode = Profile.load(args.prefill_profile), Profile.load(args.decode_profile)
    rows = []
    for setup, points in sweep["summaries"].items():
        if setup not in SETUPS:
            continue
        for point in points.values():
            if point["mix"] not in MIXES:  # multiturn: closed loop, see the docstring
                continue
            trace = trace_of(point, vocab, run_args.get("scale", 1.0))
            rows.append(compare(setup, point, trace, prefill, decode, slo))
    print(table(rows, args.tolerance))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        out = {"sweep": str(args.sweep), "profiles": [str(args.prefill_profile),
                                                      str(args.decode_profile)],
               "tolerance": args.tolerance, "rows": rows}
        (args.out / "planner_validation.json").write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
