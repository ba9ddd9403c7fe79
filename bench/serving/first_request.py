"""What a freshly started cluster's first requests cost, with and without the workers'
start-up warm-up (tandem/engine/warmup.py), side by side in one run.

    python -m bench.serving.first_request [--model smollm2] [--rounds 3] [--out docs/bench]

Each round starts a router with one prefill and one decode worker (``tandem.launcher.local_cluster``,
one core each), twice: once as they start by default (warm-up on) and once with
``--skip-warmup``, alternating which goes first. Each time it measures how long the workers
took to become ready, then sends three requests one after another (a 40-token prompt, a
300-token prompt, a 40-token prompt again; 8 tokens out each) and records each one's TTFT and
where the router placed it (its ``tandem_disagg_decision_total``). It prints the medians and
the ratio skip / warm-up: what a new worker's first users pay for its first-call costs, and
what the warm-up costs at start-up in exchange.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tandem.launcher.local_cluster import Cluster, Proc
from tandem.loadgen.load import run_load
from tandem.loadgen.stats import decision_counts
from tandem.loadgen.workload import RequestSpec

PROMPTS = (40, 300, 40)  # the first requests' prompt tokens, sent one after another
MAX_TOKENS = 8
MODES = ("warmup", "skip")


@dataclass(slots=True)
class Start:
    """One fresh cluster: its workers' start-up time and its first requests."""

    mode: str
    ready_s: float  # both workers started and READY (model load + warm-up)
    ttft_s: list[float] = field(default_factory=list)
    decisions: dict[str, float] = field(default_factory=dict)


def _decisions(router: Proc) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{router.info['http']}/metrics", timeout=30) as reply:
        return decision_counts(reply.read().decode())


def one_start(model: str, model_dir: Path, mode: str, round_no: int) -> Start:
    """Start a fresh cluster in ``mode``, send the first requests, stop it. The workers load
    ``model`` as the user names it (a GGUF alias keeps its quantized blocks, as `make serve`
    does; ``model_dir``, its dequantized copy, only gives the router its tokenizer)."""
    pin = len(os.sched_getaffinity(0)) >= 2
    engine = ["--model", model, "--threads", "1"]
    if mode == "skip":
        engine.append("--skip-warmup")
    cluster = Cluster()
    try:
        t0 = time.perf_counter()
        decode = cluster.start("tandem.worker.decode", "--port", "0", "--kv-port", "0", *engine,
                               wrap=("taskset", "-c", "1") if pin else ())
        prefill = cluster.start("tandem.worker.prefill", "--port", "0", *engine,
                                wrap=("taskset", "-c", "0") if pin else ())
        start = Start(mode, time.perf_counter() - t0)
        router = cluster.start("tandem.router", "--port", "0", "--http-port", "0", "--tokenizer",
                               str(model_dir), "--model-name", "bench",
                               "--decode", decode.grpc, "--prefill", prefill.grpc)
        for i, n in enumerate(PROMPTS):  # distinct ids: no prefix-cache hits between them
            first = 1000 + 7919 * (round_no * len(PROMPTS) + i) % 20000
            spec = RequestSpec(i, 0.0, "first", tuple(range(first, first + n)), MAX_TOKENS)
            results, _ = asyncio.run(run_load(router.grpc, [spec]))
            if not results[0].ok:
                raise RuntimeError(f"request {i} failed: {results[0].error}")
            start.ttft_s.append(results[0].ttft)
        start.decisions = _decisions(router)
        return start
    finally:
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serving.first_request", description=__doc__,
                                allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=None, help="write first_request.json here")
    args = p.parse_args(argv)

    from tandem.engine.loader import resolve_model

    model_dir = resolve_model(args.model)
    starts: list[Start] = []
    for r in range(args.rounds):
        for mode in (MODES if r % 2 == 0 else MODES[::-1]):
            print(f"[bench] round {r + 1}/{args.rounds}: {mode}", file=sys.stderr, flush=True)
            starts.append(one_start(args.model, model_dir, mode, r))
            s = starts[-1]
            print(f"[bench]   ready {s.ready_s:.1f} s, TTFT "
                  + ", ".join(f"{t * 1e3:.0f} ms" for t in s.ttft_s) + f"; {s.decisions}",
                  file=sys.stderr, flush=True)

    def med(mode: str, pick: str, i: int = 0) -> float:
        xs = [s for s in starts if s.mode == mode]
        return statistics.median(s.ready_s if pick == "ready" else s.ttft_s[i] for s in xs)

    rows = [("workers ready (s)", med("warmup", "ready"), med("skip", "ready"))]
    rows += [(f"request {i + 1} TTFT, {n} tokens (ms)", med("warmup", "ttft", i) * 1e3,
              med("skip", "ttft", i) * 1e3) for i, n in enumerate(PROMPTS)]
    print(f"{'median over ' + str(args.rounds) + ' starts':<34} {'warm-up':>9} {'skip':>9} "
          f"{'skip/warm-up':>13}")
    for name, warm, skip in rows:
        print(f"{name:<34} {warm:>9.1f} {skip:>9.1f} {skip / warm:>12.2f}x")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "first_request.json").write_text(json.dumps({
            "model": args.model, "prompts": PROMPTS, "max_tokens": MAX_TOKENS,
            "starts": [asdict(s) for s in starts],
            "medians": [{"figure": n, "warmup": w, "skip": s} for n, w, s in rows],
        }, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
