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

Every setup gets the same Poisson arrival sequence (bench/serve_workload.py). The router and
this load generator are not pinned: they share the machine with the workers in every setup.
Then the router's own cost: sequential short requests through the router and straight to the
workers (the same RPCs the router makes), alternating, TTFT p50 of each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bench.serve import add_load_args, parse_vocab, progress_printer
from bench.serve_load import run_direct, run_load
from bench.serve_report import plot, table
from bench.serve_stats import RequestResult, percentile, summarize
from bench.serve_workload import CHAT, MIXES, RequestSpec, make_requests
from common.credential import ClusterCredential
from engine.loader import resolve_model
from tandem.local_cluster import Cluster, Proc


def _engine_flags(model_dir: Path, threads: int, extra: list[str]) -> list[str]:
    return ["--model", str(model_dir), "--dtype", "float32", "--threads", str(threads), *extra]


def start_setup(
    cluster: Cluster, name: str, model_dir: Path, engine_extra: list[str],
    router_extra: Sequence[str] = (),
) -> dict[str, Proc]:
    """Start one setup's processes; returns them by role. ``router_extra``: router flags
    (the SLO the placement keeps, the same targets the benchmark scores against)."""
    pin = len(os.sched_getaffinity(0)) >= 2
    core0 = ("taskset", "-c", "0") if pin else ()
    core1 = ("taskset", "-c", "1") if pin else ()
    procs: dict[str, Proc] = {}
    if name.startswith("disagg"):
        procs["decode"] = cluster.start(
            "decode_worker", "--port", "0", "--kv-port", "0",
            *_engine_flags(model_dir, 1, engine_extra), wrap=core1,
        )
        procs["prefill"] = cluster.start(
            "prefill_worker", "--port", "0", *_engine_flags(model_dir, 1, engine_extra),
            wrap=core0,
        )
    else:
        budget = ["--max-num-batched-tokens", "256"] if name == "colocated-chunked" else []
        procs["decode"] = cluster.start(
            "decode_worker", "--port", "0", "--kv-port", "0",
            *_engine_flags(model_dir, 2, engine_extra + budget),
        )
    prefill = ["--prefill", procs["prefill"].grpc] if "prefill" in procs else []
    if name == "disagg-remote":
        prefill += ["--placement", "remote"]
    procs["router"] = cluster.start(
        "router", "--port", "0", "--http-port", "0", "--tokenizer", str(model_dir),
        "--model-name", "bench",
        "--decode", procs["decode"].grpc, *prefill, *router_extra,
    )
    return procs


def placement_decisions(router: Proc) -> dict[str, float]:
    """``decision/reason`` -> count, from the router's tandem_disagg_decision_total."""
    with urllib.request.urlopen(f"http://{router.info['http']}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "tandem_disagg_decision_total":
                found[f"{sample.labels['decision']}/{sample.labels['reason']}"] = sample.value
    return found


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
    """Run every setup, print the side-by-side table, write JSON/Markdown/PNG when asked."""
    p = argparse.ArgumentParser(prog="python -m scripts.bench_serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--chunked", action="store_true", help="also run colocated-chunked")
    p.add_argument("--overhead-requests", type=int, default=20)
    p.add_argument("--engine-arg", action="append", default=[], help="extra worker flag")
    p.add_argument("--out", type=Path, default=None, help="write serve.{json,md,png} here")
    add_load_args(p)
    args = p.parse_args(argv)
    model_dir = resolve_model(args.model)
    vocab = parse_vocab(args.vocab)
    specs = make_requests(MIXES[args.mix], args.rate, args.num_requests, seed=args.seed,
                          vocab=vocab, scale=args.scale)
    warmup = make_requests(MIXES["chat"], 1.0, 1, seed=args.seed + 1, vocab=vocab)
    setups = ["disagg", "disagg-remote", "colocated"] + (
        ["colocated-chunked"] if args.chunked else [])
    summaries: dict[str, dict] = {}
    runs: dict[str, list[RequestResult]] = {}
    overhead: dict[str, float] = {}
    for name in setups:
        cluster = Cluster()
        try:
            print(f"[bench] starting {name} ...", file=sys.stderr, flush=True)
            slo = ["--slo-ttft-s", str(args.slo_ttft), "--slo-tpot-s", str(args.slo_tpot)]
            procs = start_setup(cluster, name, model_dir, args.engine_arg, slo)
            # One throwaway request (not one of the measured ones: no prefix-cache head start)
            # warms every process (first-call allocations, JIT paths).
            asyncio.run(run_load(procs["router"].grpc, warmup))
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
