"""Serving benchmark: Poisson arrivals of a workload mix against a Tandem endpoint.

    python -m bench.serve --target 127.0.0.1:50051 --mix mixed --rate 0.3 --num-requests 60

Prints TTFT, TPOT, ITL and E2E at p50/p90/p99, throughput and goodput (the share of requests
meeting both the TTFT and the TPOT target). ``--json`` writes the summary and the per-request
records. To compare disaggregated with colocated serving on one machine, see
``scripts/bench_serve.py``, which starts both setups and runs this load against each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from bench.serve_load import run_load
from bench.serve_report import table
from bench.serve_stats import RequestResult, summarize
from bench.serve_workload import MIXES, make_requests


def add_load_args(p: argparse.ArgumentParser) -> None:
    """Flags shared by this script, scripts/bench_serve.py and ``tandem bench``."""
    p.add_argument("--mix", default="mixed", choices=sorted(MIXES), help="workload mix")
    p.add_argument("--rate", type=float, default=0.3, help="mean arrivals per second")
    p.add_argument("--num-requests", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=float, default=1.0, help="multiply every prompt/output length")
    p.add_argument("--vocab", default="1000,30000", help="token id range LO,HI of random prompts")
    p.add_argument("--slo-ttft", type=float, default=4.0, help="TTFT target, seconds")
    p.add_argument("--slo-tpot", type=float, default=0.25, help="TPOT target, seconds")
    p.add_argument("--timeout", type=float, default=900.0, help="per-request deadline, seconds")


def parse_vocab(text: str) -> tuple[int, int]:
    """``"LO,HI"`` -> (LO, HI)."""
    lo, _, hi = text.partition(",")
    return int(lo), int(hi)


def run_benchmark(
    target: str,
    args: argparse.Namespace,
    *,
    api_key: str | None = None,
    progress: Callable[[RequestResult], None] | None = None,
) -> tuple[dict[str, object], list[RequestResult]]:
    """One load run against ``target`` with the flags of ``add_load_args``; summary + records."""
    specs = make_requests(
        MIXES[args.mix], args.rate, args.num_requests, seed=args.seed,
        vocab=parse_vocab(args.vocab), scale=args.scale,
    )
    results, duration = asyncio.run(
        run_load(target, specs, api_key=api_key, timeout_s=args.timeout, progress=progress)
    )
    summary = summarize(results, duration, slo_ttft_s=args.slo_ttft, slo_tpot_s=args.slo_tpot)
    return summary, results


def progress_printer(label: str, total: int) -> Callable[[RequestResult], None]:
    """A progress callback printing one line per finished request to stderr."""
    done = 0

    def report(r: RequestResult) -> None:
        nonlocal done
        done += 1
        state = "ok" if r.ok else f"FAILED {r.error}"
        kind = r.kind if r.conversation < 0 else f"c{r.conversation}t{r.turn}"
        print(f"  [{label} {done}/{total}] {kind:4s} ttft={r.ttft * 1000:6.0f}ms "
              f"tpot={(r.tpot or 0) * 1000:5.0f}ms out={r.output_tokens} {state}",
              file=sys.stderr, flush=True)

    return report


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    p = argparse.ArgumentParser(prog="python -m bench.serve", description=__doc__,
                                allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="router HOST:PORT")
    p.add_argument("--label", default="tandem", help="column title in the table")
    p.add_argument("--json", type=Path, default=None, help="write summary + records here")
    add_load_args(p)
    args = p.parse_args(argv)

    summary, results = run_benchmark(
        args.target, args, progress=progress_printer(args.label, args.num_requests)
    )
    print(table({args.label: summary}))
    if args.json is not None:
        args.json.write_text(json.dumps(
            {"summary": summary, "records": [asdict(r) for r in results]}, indent=1))
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
