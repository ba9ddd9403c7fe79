"""Does the simulator predict real runs? tandem/planner/sim against scripts/bench_serve's sweep, point by point.

    python -m bench.planner.validation --sweep SWEEP/serve_sweep.json \\
        --prefill-profile profile-cpu2.json --decode-profile profile-cpu1.json \\
        --host-sharing served-by-length --serving served --out OUT

For every (setup, mix, rate) point of a sweep that ``scripts/bench_serve --sweep`` ran, the
same requests (tandem/loadgen/workload.make_requests with the point's seed: the same arrival
times and lengths the real run sent) are simulated on the same deployment:

    disagg          1 prefill + 1 decode worker, adaptive placement, the run's SLO
    disagg-remote   the same, every prompt remote
    colocated       1 worker prefilling its own prompts

with the profiles ``tandem profile`` measured for the roles' thread counts (prefill and
colocated workers: 2 threads; decode: 1). It prints sim / real for TTFT p50/p90, TPOT
p50/p90 and output tokens/s, and whether each is within ``--tolerance`` (15%). Multi-turn
points are skipped: their turns are sent when the previous reply ends (a closed loop), which
the simulator's open-loop traces do not model.

Host sharing (``--host-sharing DECODE,PREFILL``, e.g. ``2.1,1.8``, or the decode factor by
batch size, ``1:2.3/8:1.8,1.8``; default none): the real disaggregated setups run both
workers on one machine's cores, so each one's steps run slower while the other computes
(tandem/planner/sim/host.py); the factors are measured by ``python -m bench.serving.host_contention``. The
colocated setup has one worker: not affected. ``--host-sharing served`` takes the factors
the sweep itself measured: ``scripts/bench_serve`` logs both workers' steps
(``--step-log``) and lays them side by side per point (bench/serving/step_overlap.py), and every
point's decode steps under prefill steps and alone are compared by batch size; the points'
factors are pooled by their median. Whenever the sweep has them, the table of those served
factors is printed after the comparison.

Sensitivity (``--sensitivity 0.05``; default off): how far the predictions move with the
measured decode factors' error. Each disaggregated point is simulated again with every
decode factor times 1 - F and 1 + F, and every figure gets the range of its ratio over the
three runs; the table's last line counts the figures that fall within the tolerance
somewhere in that range. The count at the measured factors stays the result. (Near a
decode worker's capacity its TPOT moves more than the factor: up to about 2x as much.)

Served steps (``--serving served``; default off): the workers' steps under serving, with no
step of the other worker beside them, are slower than their profiles' at the same shape
(on a 2-core CPU box: decode 1.02-1.11x, prefill 1.13-1.30x plus 15-28 ms a step: the
worker's loop and its gRPC and streaming threads, the router and the client on the same
cores). From the
sweep's own step logs (bench/serving/step_overlap.py: the decode steps alone's mean shape per batch
size, every prefill step alone's shape) ``served = scale x profiled + overhead`` is fitted
per worker, and the disaggregated setups simulate each worker's profile with its step costs
times ``scale`` and ``overhead`` as its ``serving_step_s`` (the decode worker's steps with a
local prompt chunk a scale of their own on top); calibration then fits what is left. The
colocated worker's steps are all alone (it has no peer): where the sweep kept them its
two-thread profile is fitted the same way
(bench/planner/validation_inputs.py). Like ``--host-sharing served``, these are measured on the run
being predicted; ``--served-from 0.3`` takes both from the points at that rate only, so
that the other points are predicted from what the lowest rate measured, and
``--served-sweep OTHER.json`` from another run's sweep (its kept step-log figures), so that
a whole run is predicted from what an earlier one on the same host measured. ``--host-sharing served-by-length`` makes the
served prefill factor a table by prompt length (bench/step_overlap.prefill_length_table:
each prefill step beside decode steps against what the same step takes alone under
serving, pooled by prompt band), where the single factor is a ratio of per-token medians
that short prompts dominate.

Calibration (``--calibrate chat@0.3``, the default; ``none`` turns it off): a profile times
the engine alone, while a served worker also runs its loop, streams tokens and, on a shared
CPU, shares its cores with the other processes. Per setup, the one named point fixes the
profile's two serving overheads (tandem/planner/profile.py): ``serving_step_s`` from the TPOT p50 gap
and ``serving_request_s`` from the TTFT p50 gap (two rounds of sim, compare, adjust). Every
other point then tests the calibrated profile: the calibration point is marked ``cal`` and
left out of the count.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.planner.placement_inputs import placement_inputs, placement_table, remote_extra_s
from bench.planner.validation_inputs import (
    Served,
    colocated_served,
    host_sharing_of,
    served_overlaps,
    served_profiles,
)
from bench.planner.validation_tables import KEYS, METRICS, profile_table, table, worker_table
from bench.serving.step_overlap import ServedFit, overlap_table, served_sharing
from tandem.loadgen.workload import MIXES, make_requests
from tandem.placement.slo import Slo
from tandem.planner.profile import Profile
from tandem.planner.sim import ClusterSpec, simulate
from tandem.planner.sim.host import HostSharing
from tandem.planner.sim.signals import SIGNALS
from tandem.planner.trace import TraceRequest

SETUPS = {"disagg": (1, "adaptive"), "disagg-remote": (1, "remote"), "colocated": (0, "local")}
TWO_WORKERS = tuple(name for name, (pools, _) in SETUPS.items() if pools)
ONE_WORKER = tuple(name for name, (pools, _) in SETUPS.items() if not pools)


def trace_of(point: dict[str, Any], vocab: tuple[int, int], scale: float) -> list[TraceRequest]:
    """The requests the real run sent at this point, as a trace."""
    specs = make_requests(MIXES[point["mix"]], point["rate"], point["requests"],
                          seed=point["seed"], vocab=vocab, scale=scale)
    return [TraceRequest(s.arrival_s, len(s.prompt_ids), s.max_tokens, s.kind) for s in specs]


def compare(setup: str, point: dict[str, Any], trace: list[TraceRequest], prefill: Profile,
            decode: Profile, slo: Slo, sharing: HostSharing | None = None,
            signals: str = "fitted") -> dict[str, Any]:
    """Simulate one point and set its figures beside the real ones."""
    pools, placement = SETUPS[setup]
    spec = ClusterSpec(pools, 1, placement=placement, slo=slo, host_sharing=sharing,
                       signals=signals)
    placements: list[dict[str, Any]] = []  # the simulated router's --placement-log
    if pools:
        result = simulate(spec, decode, trace, prefill_profile=prefill,
                          placement_log=placements)
    else:
        result = simulate(spec, prefill, trace)  # the colocated worker owns both cores
    sim = result.summary(slo)
    row: dict[str, Any] = {"setup": setup, "mix": point["mix"], "rate": point["rate"],
                           "requests": len(trace), "sim_decisions": sim.decisions,
                           "real_decisions": point.get("decisions", {})}
    seen = placement_inputs(placements)
    if seen is not None or "placement_inputs" in point:  # the real router's, where it kept a log
        row["placement_inputs"] = {"real": point.get("placement_inputs"), "sim": seen}
    for name, group, pct, attr in METRICS:
        row[name] = {"real": point[group][pct], "sim": getattr(sim, attr)}
    row["output_tok_s"] = {"real": point["output_tok_s"], "sim": sim.output_tokens_per_s}
    row["attainment"] = {"real": point["attainment"], "sim": sim.slo_attainment}
    for key in KEYS:
        v = row[key]
        v["ratio"] = v["sim"] / v["real"] if v["real"] > 0 else float("inf")
    workers = point.get("workers", {})  # the workers' /metrics, where read
    if "decode" in workers:
        row["workers"] = {
            "decode_busy": {"real": workers["decode"]["busy"], "sim": result.decode_busy},
            "decode_step_s": {"real": workers["decode"]["mean_step_s"],
                              "sim": result.decode_mean_step_s},
            # real: tokens sampled a step (a local prompt's first token counts too)
            "decode_rows": {"real": workers["decode"]["tokens_per_step"],
                            "sim": result.decode_rows_per_step}}
        if pools and "prefill" in workers:
            row["workers"]["prefill_busy"] = {"real": workers["prefill"]["busy"],
                                              "sim": result.prefill_busy}
    return row


def calibrate(setup: str, point: dict[str, Any], trace: list[TraceRequest], prefill: Profile,
              decode: Profile, slo: Slo, sharing: HostSharing | None = None,
              rounds: int = 2, signals: str = "fitted") -> tuple[Profile, Profile]:
    """(prefill, decode) profiles with serving overheads fitted at ``point`` (see above):
    the colocated setup's worker is ``prefill`` (both cores), a disaggregated one's
    streaming worker is ``decode``."""
    for _ in range(rounds):
        row = compare(setup, point, trace, prefill, decode, slo, sharing, signals)
        worker = prefill if SETUPS[setup][0] == 0 else decode
        step = worker.serving_step_s + max(row["tpot_p50"]["real"] - row["tpot_p50"]["sim"],
                                           -worker.serving_step_s)
        worker = replace(worker, serving_step_s=step)
        prefill, decode = (worker, decode) if SETUPS[setup][0] == 0 else (prefill, worker)
        row = compare(setup, point, trace, prefill, decode, slo, sharing, signals)
        worker = prefill if SETUPS[setup][0] == 0 else decode
        request = worker.serving_request_s + max(
            row["ttft_p50"]["real"] - row["ttft_p50"]["sim"], -worker.serving_request_s)
        worker = replace(worker, serving_request_s=request)
        prefill, decode = (worker, decode) if SETUPS[setup][0] == 0 else (prefill, worker)
    return prefill, decode


def add_sensitivity(row: dict[str, Any], point: dict[str, Any], trace: list[TraceRequest],
                    prefill: Profile, decode: Profile, slo: Slo, sharing: HostSharing,
                    spread: float, signals: str = "fitted") -> None:
    """Give each of ``row``'s figures its ratio's range over the decode factors times
    1 - ``spread``, 1 and 1 + ``spread`` (``row`` is ``compare``'s at 1)."""
    others = [compare(row["setup"], point, trace, prefill, decode, slo,
                      sharing.decode_scaled(k), signals) for k in (1 - spread, 1 + spread)]
    for key in KEYS:
        ratios = [row[key]["ratio"]] + [o[key]["ratio"] for o in others]
        row[key]["range"] = [min(ratios), max(ratios)]


def handoff_gap(sweep: dict[str, Any], prefill: Profile, decode: Profile,
                vocab: tuple[int, int], scale: float, slo: Slo, sharing: HostSharing | None,
                signals: str) -> float | None:
    """Seconds the real router's learnt remote overhead exceeds the simulated one's: the
    median over the adaptive setup's chat-load points with a placement log of their medians
    (bench/planner/placement_inputs.py), real minus simulated; None without such a point. The chat
    load only: in the mixed load a short prompt's overhead also holds its wait behind long
    prompts, which the host model prices differently.
    The simulated overhead is the profile's transfer latency and whatever the host model
    adds; the real one is every RPC of the handoff on a loaded host (the profile measures
    the KV transport alone) and the real prefill worker's fit error, so ``--handoff served``
    adds this gap to the prefill profile's transfer latency. Split apart on the 2-core CPU
    box (bench/serving/prefill_residuals.py), the handoff was 8-10 ms of it and the rest the
    prefill worker's fit error under serving, which the simulated worker's own fit lacks."""
    gaps = []
    for setup, points in sweep["summaries"].items():
        if setup not in SETUPS or SETUPS[setup][1] != "adaptive":
            continue
        for point in points.values():
            real = remote_extra_s((point.get("placement_inputs") or {}).get("chat") or {})
            if real is None or point["mix"] != "chat":
                continue
            row = compare(setup, point, trace_of(point, vocab, scale), prefill, decode, slo,
                          sharing, signals)
            sim = remote_extra_s(((row.get("placement_inputs") or {}).get("sim") or {})
                                 .get("chat") or {})
            if sim is not None:
                gaps.append(real - sim)
    return statistics.median(gaps) if gaps else None


def with_handoff(profile: Profile, extra_s: float) -> Profile:
    """``profile`` with ``extra_s`` more on every handoff (its transfer latency; >= 0)."""
    latency = max(profile.transfer.latency_s + extra_s, 0.0)
    return replace(profile, transfer=replace(profile.transfer, latency_s=latency))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep", type=Path, required=True, help="serve_sweep.json of a real run")
    p.add_argument("--prefill-profile", type=Path, required=True,
                   help="profile of the prefill and colocated workers (2 threads)")
    p.add_argument("--decode-profile", type=Path, required=True,
                   help="profile of the decode worker (1 thread)")
    p.add_argument("--tolerance", type=float, default=0.15)
    p.add_argument("--calibrate", default="chat@0.3",
                   help="MIX@RATE point that fixes the serving overheads, or none")
    p.add_argument("--host-sharing", default=None, metavar="DECODE,PREFILL",
                   help="slowdowns of the disaggregated setups' co-located workers; DECODE "
                        "one factor or ROWS:FACTOR pairs joined by / (bench.serving.host_contention); "
                        "'served': the factors the sweep's own step logs measured; "
                        "'served-by-length': the same with the prefill factor by prompt "
                        "length")
    p.add_argument("--serving", default=None, choices=["served"],
                   help="the workers' profiles fitted to the sweep's own step logs (each "
                        "disaggregated worker's steps with no step of the other beside "
                        "them; the colocated worker's steps)")
    p.add_argument("--served-from", type=float, default=None, metavar="RATE",
                   help="take the served factors and fits from the points at this rate only "
                        "(and predict the others from them); default: every point")
    p.add_argument("--served-sweep", type=Path, default=None, metavar="SWEEP",
                   help="take the served factors and fits from another run's sweep file (a "
                        "run on the same host); default: the sweep being predicted")
    p.add_argument("--handoff", default=None, metavar="served|SECONDS",
                   help="add to the prefill profile's transfer latency (the handoff's fixed "
                        "cost): 'served', the gap between the real router's learnt remote "
                        "overhead and the simulated one's (the placement logs of the "
                        "sweep's chat-load points); a number, that many seconds (e.g. "
                        "another run's gap)")
    p.add_argument("--sensitivity", type=float, default=0.0, metavar="F",
                   help="also simulate the shared setups with the decode factors x (1 +- F)")
    p.add_argument("--signals", default="fitted", choices=list(SIGNALS),
                   help="the step costs the simulated workers report to the router: their own "
                        "online fit (as real workers) or the profile's (tandem/planner/sim/signals.py)")
    p.add_argument("--out", type=Path, default=None, help="write planner_validation.json here")
    args = p.parse_args(argv)
    sweep = json.loads(args.sweep.read_text())
    logged = sweep if args.served_sweep is None else json.loads(args.served_sweep.read_text())
    served, alone = served_overlaps(logged, TWO_WORKERS), served_overlaps(logged, ONE_WORKER)

    def chosen(points: Served) -> Served:
        return [o for o in points if args.served_from is None
                or abs(o[2] - args.served_from) < 1e-9]

    source, alone_source = chosen(served), chosen(alone)
    base = Profile.load(args.prefill_profile), Profile.load(args.decode_profile)
    shared: tuple[Profile, Profile] = base
    colocated = base[0]  # the colocated worker runs on the two-thread profile
    fits: dict[str, ServedFit | None] = {}
    try:
        args.host_sharing = host_sharing_of(args.host_sharing, source, *base)
        if args.serving == "served":
            if not source and not alone_source:
                raise ValueError("--serving served: the sweep kept no step logs to fit "
                                 "(scripts/bench_serve --out keeps them)")
            if source:
                pre, dec, fits = served_profiles(source, *base)
                shared = pre, dec
            if alone_source:
                colocated, colocated_fits = colocated_served(alone_source, base[0])
                fits |= colocated_fits
    except ValueError as exc:
        p.error(str(exc))
    for role, fit in fits.items():
        print(f"served {role} steps alone = profile {fit.flag() if fit else '(no fit)'}")
    run_args = sweep["config"]  # the workload and SLO scripts/bench_serve ran
    vocab = tuple(int(x) for x in run_args["vocab"].split(","))
    slo = Slo(run_args["slo_ttft"], run_args["slo_tpot"])
    scale = run_args.get("scale", 1.0)
    cal_mix, _, cal_rate = args.calibrate.partition("@")
    if args.handoff is not None:
        if args.handoff == "served":
            gap = handoff_gap(sweep, *shared, vocab, scale, slo, args.host_sharing, args.signals)
            if gap is None:
                p.error("--handoff served: the sweep has no placement log")
        else:
            try:
                gap = float(args.handoff)
            except ValueError:
                p.error(f"--handoff: 'served' or seconds, not {args.handoff!r}")
        shared = with_handoff(shared[0], gap), shared[1]
        print(f"handoff: +{gap * 1e3:.1f} ms on the prefill profile's transfer latency "
              f"(now {shared[0].transfer.latency_s * 1e3:.1f} ms)")
    rows = []
    for setup, points in sweep["summaries"].items():
        if setup not in SETUPS:
            continue
        prefill, decode = (colocated, base[1]) if SETUPS[setup][0] == 0 else shared
        cal = next((pt for pt in points.values() if args.calibrate != "none"
                    and pt["mix"] == cal_mix and abs(pt["rate"] - float(cal_rate)) < 1e-9),
                   None)
        if cal is not None:
            prefill, decode = calibrate(setup, cal, trace_of(cal, vocab, scale), prefill,
                                        decode, slo, args.host_sharing, signals=args.signals)
        worker = prefill if SETUPS[setup][0] == 0 else decode
        for point in points.values():
            if point["mix"] not in MIXES:  # multiturn: closed loop, see the docstring
                continue
            trace = trace_of(point, vocab, scale)
            row = compare(setup, point, trace, prefill, decode, slo, args.host_sharing,
                          args.signals)
            if args.sensitivity and args.host_sharing is not None and SETUPS[setup][0]:
                add_sensitivity(row, point, trace, prefill, decode, slo, args.host_sharing,
                                args.sensitivity, args.signals)
            row["calibration"] = point is cal
            row["serving_step_s"] = worker.serving_step_s
            row["serving_request_s"] = worker.serving_request_s
            rows.append(row)
    print(table(rows, args.tolerance))
    workers = worker_table(rows)
    if workers:
        print("\nworkers, real / simulated:\n" + workers)
    inputs = placement_table(rows)
    if inputs:
        print("\nwhat the placement model saw for chat-sized prompts (medians over its "
              "decisions, real / simulated; seconds in ms):\n" + inputs)
    if served:
        pooled = served_sharing([o for *_, o in served], base[1].step)
        print("\nunder serving (the workers' step logs): the share of each one's stepping "
              "time under the other's steps; decode step shared / alone by batch size; "
              "prefill per token\n" + overlap_table(served)
              + (f"\npooled: --host-sharing {pooled.flag()}" if pooled else "")
              + (f"\nsimulated with: --host-sharing {args.host_sharing.flag()}"
                 if args.host_sharing is not None else ""))
        print("\ndecode steps alone (no prefill step beside them), served / the decode "
              "profile's step at their mean rows and context:\n"
              + profile_table(served, base[1]))
    if alone:
        print("\nthe colocated worker's decode steps, served / its profile's step at their "
              "mean rows and context:\n" + profile_table(alone, base[0]))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        out = {"sweep": str(args.sweep), "profiles": [str(args.prefill_profile),
                                                      str(args.decode_profile)],
               "tolerance": args.tolerance, "sensitivity": args.sensitivity,
               "served_from": args.served_from, "signals": args.signals,
               "served_sweep": None if args.served_sweep is None else str(args.served_sweep),
               "handoff": args.handoff,
               "prefill_transfer_latency_s": shared[0].transfer.latency_s,
               "serving": {role: None if fit is None else {
                   "scale": fit.scale, "overhead_s": fit.overhead_s, "steps": fit.steps}
                   for role, fit in fits.items()}, "rows": rows,
               "host_sharing": None if args.host_sharing is None else {
                   "flag": args.host_sharing.flag(),
                   "decode_slowdown": args.host_sharing.decode_slowdown,
                   "prefill_slowdown": args.host_sharing.prefill_slowdown}}
        (args.out / "planner_validation.json").write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
