"""Disaggregated vs colocated serving on one machine, same cores, same workload.

    python -m scripts.bench_serve --out docs/bench            (SmolLM2, ~15 minutes on 2 cores)

Setups (each a fresh set of real processes, started and stopped here):

    disagg     router + 1 prefill worker pinned to core 0 + 1 decode worker pinned to core 1;
               the router places each prompt (adaptive placement, the default)
    disagg-remote  the same processes, every prompt prefilled on the prefill worker
               (``--placement remote``: disaggregation as it was before adaptive placement)
    colocated  router + 1 decode worker on cores 0-1 that prefills locally (2 threads)
    colocated-chunked  (with --chunked) the same with a 256-token step budget, so prefill
               is chunked between decode steps: the usual colocated remedy

``--cores N`` (even) runs the same setups on N cores: the prefill worker on the first half and
the decode worker on the second, N/2 threads each, a colocated worker on all N (the layout
scripts/gpu_check.sh measures on a device machine's 16 cores).

Each setup's processes and their pinning: bench/serving/setups.py; what a point reads from
their /metrics pages: bench/serving/setup_metrics.py.

Every setup gets the same Poisson arrival sequence (tandem/loadgen/workload.py). The router and
this load generator are not pinned: they share the machine with the workers in every setup.
Then the router's own cost: sequential short requests through the router and straight to the
workers (the same RPCs the router makes), alternating, TTFT p50 of each.

Rate sweep (DistServe's goodput: the highest rate at which 90% of requests meet both the TTFT
and the TPOT target), every setup started once and every (mix, rate) point run on it in turn:

    python -m scripts.bench_serve --sweep 0.2,0.4,0.6 --mixes mixed,multiturn,chat \
        --num-requests 30 --out docs/bench

``--num-requests`` is per point (multiturn: turns in all). Prints capacities, attainment at
each rate and the adaptive/colocated and remote/colocated ratios per mix, plus the prefix
cache's share of each multiturn turn's prompt; writes serve_sweep.{json,png}. No router
overhead run. Time on 2 cores (SmolLM2): a point takes about num_requests / rate seconds of
arrivals plus 20-60 s to drain (longer past capacity), so 30 requests at 0.2, 0.4 and 0.6/s
is ~6 minutes per mix, ~18 per setup, ~1 hour (up to ~1.5 h when overloaded) for 3 setups.
Each point also records each worker's activity from its /metrics and its ``host_overlap``
(bench/serving/step_overlap.py): the workers run with ``--step-log`` (kept in ``OUT/steps-<setup>/``
with ``--out``) and each decode step is compared alone and under prefill steps (a colocated
setup's steps are all alone: what its served fits read); the router keeps its placement
log there too, summarized per point as ``placement_inputs`` (bench/planner/placement_inputs.py) and
``prefill_residuals`` (where each placed prefill's time went against its prediction:
bench/serving/prefill_residuals.py).

``--fresh-workers`` starts each setup's processes again for every point (about 20 s each):
a point then starts from freshly started workers, as the simulator's points do
(bench/planner/validation.py), instead of inheriting what the previous points left: the
workers' fitted step costs, which the router's placement reads (an adaptive setup has
placed every chat prompt locally after the mixed load had taught the prefill worker's fit
3 ms a token), the prefix caches, the overheads the router has learnt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from bench.planner.placement_inputs import placement_inputs
from bench.serving.logs import (
    PointLogs,
    read_point_logs,
    steps_dir,
)
from bench.serving.prefill_residuals import point_residuals
from bench.serving.setup_metrics import placement_decisions, wait_idle, worker_reads
from bench.serving.setups import core_split, start_warm
from bench.serving.step_overlap import host_overlap
from tandem.common.security.credential import ClusterCredential
from tandem.engine.loader import resolve_model
from tandem.launcher.local_cluster import Cluster, Proc
from tandem.loadgen.load import run_direct, run_load
from tandem.loadgen.report import Curves, plot, plot_sweep, sweep_table, table, turn_table
from tandem.loadgen.run import add_load_args, parse_vocab, progress_printer
from tandem.loadgen.stats import (
    RequestResult,
    attainment,
    by_turn,
    percentile,
    summarize,
    worker_activity,
)
from tandem.loadgen.sweep import (
    MULTITURN,
    max_rate,
    parse_mixes,
    parse_rates,
    run_point,
    sweep_points,
)
from tandem.loadgen.workload import CHAT, MIXES, RequestSpec, make_requests


def log_summaries(logs: PointLogs, window: tuple[float, float], records: list[dict]
                  ) -> dict:
    """What a point's logs (``window``: its wall-clock span) add to its summary:
    ``host_overlap`` (the step logs: how the decode steps fared beside the prefill steps,
    bench/serving/step_overlap.py; a colocated setup's one worker has no steps beside its own, so
    all of them count as alone: its served fits), ``placement_inputs`` (the router's
    placement log, when its model decided: bench/planner/placement_inputs.py) and
    ``prefill_residuals`` (all three, when the decisions match the requests ``records``:
    bench/serving/prefill_residuals.py)."""
    prefill, decode, placements = logs
    out: dict[str, dict | None] = {}
    if decode is not None:
        out["host_overlap"] = host_overlap(decode, prefill or ()) | {"window": list(window)}
    if placements is not None:
        out["placement_inputs"] = placement_inputs(placements)
        if prefill is not None and decode is not None:
            out["prefill_residuals"] = point_residuals(records, placements, prefill, decode)
    return {k: v for k, v in out.items() if v is not None}


def run_sweep(
    args: argparse.Namespace, model_dir: Path, setups: list[str], warmup: list[RequestSpec]
) -> dict[str, object]:
    """Every setup started once, every (mix, rate) point run on it in turn (with
    ``args.fresh_workers``: started again for every point); JSON-ready."""
    points = sweep_points(parse_mixes(args.mixes or args.mix), parse_rates(args.sweep),
                          args.seed)
    vocab = parse_vocab(args.vocab)
    curves: Curves = {}
    summaries: dict[str, dict[str, dict]] = {}
    records: dict[str, dict[str, list[dict]]] = {}
    turns: dict[str, dict[int, dict[str, float]]] = {}
    for name in setups:
        curves[name], summaries[name], records[name] = {}, {}, {}
        multiturn: list[RequestResult] = []
        cluster = Cluster()
        # the workers' step logs: kept beside the results with --out, else removed at the end
        step_logs = (Path(tempfile.mkdtemp(prefix="tandem-bench-steps-")) if args.out is None
                     else steps_dir(args.out, name))
        step_logs.mkdir(parents=True, exist_ok=True)
        try:
            procs: dict[str, Proc] = {}
            for point in points:
                if not procs or args.fresh_workers:
                    cluster.stop()  # nothing to stop the first time
                    procs = start_warm(cluster, name, model_dir, args, warmup, step_logs)
                    router = procs["router"]
                label = f"{name} {point.label}"
                before = placement_decisions(router)
                busy_before = worker_reads(procs)
                began = time.time()
                results, duration = asyncio.run(run_point(
                    router.grpc, point, args.num_requests, vocab=vocab, scale=args.scale,
                    timeout_s=args.timeout, progress=progress_printer(label, args.num_requests),
                    system_seed=args.seed,
                ))
                wait_idle(router)
                ended = time.time()
                summary = summarize(results, duration, slo_ttft_s=args.slo_ttft,
                                    slo_tpot_s=args.slo_tpot)
                share = attainment(results, args.slo_ttft, args.slo_tpot)
                after = placement_decisions(router)
                summary |= {"mix": point.mix, "rate": point.rate, "seed": point.seed,
                            "attainment": share,
                            "decisions": {k: v - before.get(k, 0.0) for k, v in after.items()},
                            "workers": {role: worker_activity(busy_before.get(role, {}), now,
                                                              duration)
                                        for role, now in worker_reads(procs).items()}}
                point_records = [asdict(r) for r in results]
                summary |= log_summaries(read_point_logs(step_logs, began, ended),
                                         (began, ended), point_records)
                summaries[name][point.label] = summary
                records[name][point.label] = point_records
                curves[name].setdefault(point.mix, []).append((point.rate, share))
                if point.mix == MULTITURN:
                    multiturn += results
                print(f"[bench] {label}: SLO attainment {share:.0%}", file=sys.stderr,
                      flush=True)
        finally:
            cluster.stop()
            if args.out is None:
                shutil.rmtree(step_logs, ignore_errors=True)
        if multiturn:
            turns[name] = by_turn(multiturn)
    return {
        "curves": curves,
        "max_rate": {s: {m: max_rate(c).to_json() for m, c in per.items()}
                     for s, per in curves.items()},
        "by_turn": turns, "summaries": summaries, "records": records,
    }


def _report_sweep(args: argparse.Namespace, sweep: dict) -> None:
    text = sweep_table(sweep["curves"])
    if sweep["by_turn"]:
        text += "\n\nmultiturn, prefix cache by turn (all rates):\n" + turn_table(sweep["by_turn"])
    text += (f"\n\nSLO: TTFT <= {args.slo_ttft:g} s and TPOT <= {args.slo_tpot:g} s; "
             f"{args.num_requests} requests per point; '0 (all miss)': even the lowest rate "
             "was under 90%; '>= r': the highest rate swept still met it")
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        config = {k: v for k, v in vars(args).items() if k != "out"}
        (args.out / "serve_sweep.json").write_text(
            json.dumps({"config": config, **sweep}, indent=1, default=str))
        plot_sweep(sweep["curves"], args.out / "serve_sweep.png",
                   title=f"SLO attainment (TTFT <= {args.slo_ttft:g} s, TPOT <= "
                         f"{args.slo_tpot:g} s), {args.num_requests} requests per point")


def router_overhead(
    procs: dict[str, Proc], n: int, vocab: tuple[int, int], credential: ClusterCredential
) -> dict[str, float]:
    """TTFT p50 of short sequential requests via the router vs straight to the workers."""
    specs = make_requests(MIXES["chat"], 1.0, 2 * n, seed=99, vocab=vocab)
    short = [RequestSpec(s.index, 0.0, "short", s.prompt_ids[: CHAT.prompt_tokens[0]], 2)
             for s in specs]
    via_router: list[float] = []
    direct: list[float] = []
    prefill = procs["prefill"].grpc if "prefill" in procs else None
    for i in range(n):  # alternate so drift in machine state hits both equally
        r, _ = asyncio.run(run_load(procs["router"].grpc, [short[2 * i]]))
        d, _ = asyncio.run(run_direct(procs["decode"].grpc, prefill, [short[2 * i + 1]],
                                      credential=credential))
        if r[0].ok and d[0].ok:
            via_router.append(r[0].ttft)
            direct.append(d[0].ttft)
    return {
        "n": len(via_router),
        "router_ttft_p50_ms": percentile(via_router, 50) * 1000,
        "direct_ttft_p50_ms": percentile(direct, 50) * 1000,
        "added_p50_ms": (percentile(via_router, 50) - percentile(direct, 50)) * 1000,
    }


def main(argv: list[str] | None = None) -> int:
    """Run every setup, print the side-by-side table, write JSON/PNG when asked; with
    ``--sweep``, the rate sweep instead (serve_sweep.{json,png})."""
    p = argparse.ArgumentParser(prog="python -m scripts.bench_serve", description=__doc__,
                                allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--chunked", action="store_true", help="also run colocated-chunked")
    p.add_argument("--overhead-requests", type=int, default=20)
    p.add_argument("--engine-arg", action="append", default=[], help="extra worker flag")
    p.add_argument("--setups", default=None,
                   help="comma list of setups to run (default: disagg,disagg-remote,colocated)")
    p.add_argument("--prefill-threads", type=int, default=1,
                   help="disagg setups: prefill worker threads (>1: on every core)")
    p.add_argument("--cores", type=int, default=0, metavar="N",
                   help="pin to N cores (even): prefill on the first half and decode on the "
                   "second, N/2 threads each; colocated on all N with N threads (default: the "
                   "two-core layout above)")
    p.add_argument("--out", type=Path, default=None, help="write serve.{json,md,png} here")
    p.add_argument("--sweep", default=None, metavar="RATES",
                   help="comma list of rates: run a rate sweep instead of one --rate")
    p.add_argument("--mixes", default=None, help="with --sweep: comma list of mixes "
                   "(default: --mix), from mixed, chat, rag, multiturn")
    p.add_argument("--fresh-workers", action="store_true",
                   help="with --sweep: start each setup's processes again for every point")
    add_load_args(p)
    args = p.parse_args(argv)
    if args.cores:
        try:
            core_split(args.cores)
        except ValueError as err:
            p.error(str(err))
        if args.cores > len(os.sched_getaffinity(0)):
            p.error(f"--cores {args.cores}: this process may run on "
                    f"{len(os.sched_getaffinity(0))} cores")
    if args.mixes is not None and args.sweep is None:
        p.error("--mixes needs --sweep")
    if args.fresh_workers and args.sweep is None:
        p.error("--fresh-workers needs --sweep")
    if args.sweep is not None:
        try:
            parse_rates(args.sweep)
            parse_mixes(args.mixes or args.mix)
        except ValueError as err:
            p.error(str(err))
    model_dir = resolve_model(args.model)
    vocab = parse_vocab(args.vocab)
    warmup = make_requests(MIXES["chat"], 1.0, 1, seed=args.seed + 1, vocab=vocab)
    setups = (args.setups.split(",") if args.setups else
              ["disagg", "disagg-remote", "colocated"]) + (
        ["colocated-chunked"] if args.chunked else [])
    if args.sweep is not None:
        _report_sweep(args, run_sweep(args, model_dir, setups, warmup))
        return 0
    specs = make_requests(MIXES[args.mix], args.rate, args.num_requests, seed=args.seed,
                          vocab=vocab, scale=args.scale)
    summaries: dict[str, dict] = {}
    runs: dict[str, list[RequestResult]] = {}
    overhead: dict[str, float] = {}
    for name in setups:
        cluster = Cluster()
        try:
            procs = start_warm(cluster, name, model_dir, args, warmup)
            results, duration = asyncio.run(run_load(
                procs["router"].grpc, specs, timeout_s=args.timeout,
                progress=progress_printer(name, len(specs)),
            ))
            runs[name] = results
            summaries[name] = summarize(results, duration, slo_ttft_s=args.slo_ttft,
                                        slo_tpot_s=args.slo_tpot)
            summaries[name]["decisions"] = placement_decisions(procs["router"])
            print(f"[bench] {name} placement: {summaries[name]['decisions']}",
                  file=sys.stderr, flush=True)
            if name == "disagg":
                print("[bench] router overhead ...", file=sys.stderr, flush=True)
                overhead = router_overhead(procs, args.overhead_requests, vocab,
                                           cluster.credential)
        finally:
            cluster.stop()
    ratio = summaries["disagg"]["tpot"]["p99"] / summaries["colocated"]["tpot"]["p99"]
    ttft_ratio = summaries["disagg"]["ttft"]["p90"] / summaries["colocated"]["ttft"]["p90"]
    goodput_ratio = (summaries["disagg"]["goodput_rps"]
                     / max(summaries["colocated"]["goodput_rps"], 1e-9))
    text = table(summaries)
    text += (f"\n\nTPOT p99 disagg/colocated = {ratio:.2f} (target <= 0.5); "
             f"TTFT p90 disagg/colocated = {ttft_ratio:.2f} (target <= 1.2); "
             f"goodput disagg/colocated = {goodput_ratio:.2f} (target >= 1.3)\n"
             f"router overhead: TTFT p50 {overhead.get('router_ttft_p50_ms', float('nan')):.1f} "
             f"ms via router vs {overhead.get('direct_ttft_p50_ms', float('nan')):.1f} ms direct "
             f"(+{overhead.get('added_p50_ms', float('nan')):.1f} ms, target < 2 ms)")
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        config = {k: v for k, v in vars(args).items() if k != "out"}
        (args.out / "serve.json").write_text(json.dumps({
            "config": config, "summaries": summaries, "router_overhead": overhead,
            "tpot_p99_ratio": ratio, "ttft_p90_ratio": ttft_ratio,
            "goodput_ratio": goodput_ratio,
            "records": {k: [asdict(r) for r in v] for k, v in runs.items()},
        }, indent=1, default=str))
        plot(runs, args.out / "serve.png",
             title=f"{args.mix} mix, {args.rate}/s Poisson, {args.num_requests} requests")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
