"""Serving under the load shapes users run, every configuration against llama-server, one run.

    python -m bench.serving.load_shapes [--threads 2] [--configs ...] [--shapes ...] [--rounds N]
                                        [--out DIR]

Each server runs on the same ``--threads`` cores (taskset), the client on this machine beside it
(as on a laptop or a shared node: its CPU counts), SmolLM2-135M-Instruct's Q4_1 GGUF on both
sides, greedy with ``ignore_eos`` (fixed lengths), streaming ``/v1/completions``:

    burst     32 streams sent at once, 128 prompt tokens, 128 out (every prompt prefilled
              first, then pure decode: the shape a light client gives)
    steady    a closed loop of 8 users, 32 requests of ~230 prompt tokens and 64 out, each
              user sending its next request when its last one ends (aiperf's chat load)
    poisson   the serving benchmark's mixed workload (70% chat turns, 30% RAG prompts of
              768-1,024 tokens) as Poisson arrivals at ``--rate``
    aiperf    the steady shape driven by NVIDIA aiperf itself (``--aiperf PATH`` or ``aiperf``
              on PATH; /v1/chat/completions with synthetic text, its own tokenizer and
              multi-process client: a heavier client than ours, as users run it)

Configurations (``tandem local`` flags; llama-server with as many slots as the shape has
concurrent requests, every thread for prefill and decode):

    default        tandem local as users start it
    no-core-share  the decode worker keeps to its own thread
    always-borrow  default, but the decode worker borrows whenever the lease is granted
                   (the lease without measuring: --step-threads fixed)
    colocated      --no-prefill: one worker prefilling its own prompts
    colocated-1t   --no-prefill --decode-threads 1
    llama-server   llama.cpp's server, same GGUF and threads

Prints, per shape, each configuration's output tokens/s, ITL p50 and TTFT p50, the default's
ratio to the best Tandem configuration and to llama-server; ``--out`` writes load_shapes.json,
load_shapes.png and load_shapes.md. llama.cpp's binaries come from bench/vs_llama_cpp/binaries.py
(``--build`` builds them, ~7-20 minutes on 2 cores). A full run takes ~25 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from bench.vs_llama_cpp.binaries import LlamaCpp, find_or_build
from bench.vs_llama_cpp.compare import pin
from bench.vs_llama_cpp.compare import tandem_local as local_on_cores
from bench.vs_llama_cpp.theirs import llama_server
from tandem.loadgen.load import run_openai
from tandem.loadgen.stats import summarize
from tandem.loadgen.workload import MIXES, RequestSpec, make_requests

T0 = time.monotonic()
VOCAB = (1000, 30000)  # random prompt ids inside SmolLM2's vocabulary
TANDEM = {
    "default": (),
    "no-core-share": ("--no-core-share",),
    "always-borrow": ("--worker-arg=--step-threads=fixed",),
    "colocated": ("--no-prefill",),
    "colocated-1t": ("--no-prefill", "--decode-threads", "1"),
}
CONFIGS = (*TANDEM, "llama-server")
SHAPES = ("burst", "steady", "poisson", "aiperf")


def note(msg: str) -> None:
    print(f"[load-shapes {time.monotonic() - T0:5.0f} s] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class Shape:
    """One load: its requests, how many may be in flight, and llama-server's slots for it."""

    name: str
    specs: list[RequestSpec]
    max_concurrency: int | None
    slots: int
    slot_ctx: int


def _random(count: int, length: int, out: int, rng: random.Random) -> list[RequestSpec]:
    return [RequestSpec(i, 0.0, "fixed",
                        tuple(rng.randrange(*VOCAB) for _ in range(length)), out)
            for i in range(count)]


def shapes(names: Sequence[str], rate: float, poisson_requests: int, seed: int) -> list[Shape]:
    """The loads named, built once so every server gets the same requests."""
    rng = random.Random(seed)
    made = {
        "burst": lambda: Shape("burst", _random(32, 128, 128, rng), None, 32, 320),
        "steady": lambda: Shape("steady", [RequestSpec(i, 0.0, "chat", s.prompt_ids, 64)
                                           for i, s in enumerate(_random(32, 230, 64, rng))],
                                8, 8, 384),
        "poisson": lambda: Shape("poisson", make_requests(
            MIXES["mixed"], rate, poisson_requests, seed=seed, vocab=VOCAB), None, 16, 1280),
        "aiperf": lambda: Shape("aiperf", [], 8, 8, 512),
    }
    return [made[n]() for n in names]


def tandem_local(flags: Sequence[str], threads: int) -> AbstractContextManager[str]:
    """``tandem local`` with ``flags`` on ``threads`` cores until the block ends; its HTTP base
    URL once the router answers /ready."""
    return local_on_cores(pin(threads), flags, ready_s=180.0)


def measure_aiperf(base: str, aiperf: str, seed: int) -> dict:
    """aiperf's chat load (the steady shape: concurrency 8, 32 requests, 230 tokens in, 64
    out, ignore_eos) against ``base``; its own figures."""
    from tandem.engine.loader import resolve_model

    with tempfile.TemporaryDirectory() as out:
        cmd = [aiperf, "profile", "--model", "smollm2", "--url", base, "--endpoint-type", "chat",
               "--streaming", "--concurrency", "8", "--request-count", "32",
               "--warmup-request-count", "2",
               "--prompt-input-tokens-mean", "230", "--prompt-input-tokens-stddev", "0",
               "--prompt-output-tokens-mean", "64", "--prompt-output-tokens-stddev", "0",
               "--extra-inputs", "ignore_eos:true", "--tokenizer", str(resolve_model("smollm2")),
               "--random-seed", str(seed), "--output-artifact-dir", out, "--ui-type", "none"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"aiperf exited {done.returncode}: {done.stderr[-300:]}")
        d = json.loads((Path(out) / "profile_export_aiperf.json").read_text())
    errors = sum(e.get("count", 0) for e in d.get("error_summary") or [])
    return {"output_tok_s": d["output_token_throughput"]["avg"],
            "itl_p50_ms": d["inter_token_latency"]["p50"],
            "tpot_p50_ms": d["inter_token_latency"]["p50"],
            "ttft_p50_s": d["time_to_first_token"]["p50"] / 1e3,
            "ttft_p90_s": d["time_to_first_token"]["p90"] / 1e3, "errors": errors,
            "duration_s": d["benchmark_duration"]["avg"], "error_sample": []}


def measure(base: str, shape: Shape) -> dict:
    """One shape against one server: warm-up, then the load; the summary with ITL p50."""
    asyncio.run(run_openai(base, _random(2, 32, 8, random.Random(1)), timeout_s=300.0))
    results, wall = asyncio.run(run_openai(base, shape.specs, timeout_s=900.0,
                                           max_concurrency=shape.max_concurrency))
    short = [r for r in results if r.ok and r.output_tokens != shape.specs[r.index].max_tokens]
    summary = summarize(results, wall, slo_ttft_s=4.0, slo_tpot_s=0.25)
    summary["short"] = len(short)  # ignore_eos: a complete reply has exactly max_tokens
    fig = _figures(summary)
    fig["error_sample"] = (summary["errors"][:1] or [f"{len(short)} replies short: "
                                                    f"{[r.output_tokens for r in short][:4]}"]
                           if fig["errors"] else [])
    return fig


def _figures(s: dict) -> dict:
    return {"output_tok_s": s["output_tok_s"], "itl_p50_ms": 1e3 * s["itl"]["p50"],
            "tpot_p50_ms": 1e3 * s["tpot"]["p50"], "ttft_p50_s": s["ttft"]["p50"],
            "ttft_p90_s": s["ttft"]["p90"], "errors": s["failed"] + s["short"],
            "duration_s": s["duration_s"]}


def server(config: str, shape: Shape, threads: int, lc: LlamaCpp | None,
           gguf: Path, extra: Sequence[str] = ()) -> AbstractContextManager[str]:
    if config == "llama-server":
        assert lc is not None
        return llama_server(lc, gguf, threads, shape.slots, wrap=pin(threads),
                            slot_ctx=shape.slot_ctx)
    return tandem_local((*TANDEM[config], *extra), threads)


def run(args: argparse.Namespace, lc: LlamaCpp | None, gguf: Path,
        progress: Callable[[str], None] = note) -> dict:
    """Every configuration under every shape, ``args.rounds`` times over (each round runs every
    configuration once, so a round's rows share the machine's state of the moment; a server
    started once per configuration and shape, so no shape runs on another's warm caches); the
    JSON-ready results: each row the median of its rounds, each ratio the median of the
    rounds' own ratios."""
    loads = shapes(args.shapes, args.rate, args.poisson_requests, args.seed)
    configs = list(args.configs)
    if "llama-server" in configs and lc is None:
        progress("llama-server: no binaries (bench/vs_llama_cpp/binaries.py --build); skipped")
        configs.remove("llama-server")
    rounds: list[dict[str, dict[str, dict]]] = []
    for k in range(args.rounds):
        rows: dict[str, dict[str, dict]] = {s.name: {} for s in loads}
        for config in configs:
            for shape in loads:
                progress(f"round {k + 1}/{args.rounds}, {config}: {shape.name} "
                         f"({len(shape.specs)} requests)")
                try:
                    with server(config, shape, args.threads, lc, gguf, args.tandem_flag) as base:
                        rows[shape.name][config] = fig = (
                            measure_aiperf(base, args.aiperf, args.seed)
                            if shape.name == "aiperf" else measure(base, shape))
                except Exception as exc:  # a server that fails is a row that says so
                    rows[shape.name][config] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                    progress(f"  failed: {exc}")
                    continue
                progress(f"  {fig['output_tok_s']:.1f} tok/s, ITL p50 {fig['itl_p50_ms']:.0f} "
                         f"ms, TTFT p50 {fig['ttft_p50_s']:.2f} s, errors {fig['errors']}")
        rounds.append(rows)
    return {"rows": median_rows(rounds), "ratios": median_ratios(rounds),
            "rounds": rounds, "machine": machine(args.threads),
            "command": "python -m bench.serving.load_shapes " + " ".join(args.argv)}


def median_rows(rounds: list[dict[str, dict[str, dict]]]) -> dict[str, dict[str, dict]]:
    """Each (shape, configuration)'s figures, the median over the rounds it did not fail in
    (errors summed, each round's output tok/s kept as ``rounds_tok_s``); a row that failed
    in every round keeps its first error."""
    out: dict[str, dict[str, dict]] = {}
    for shape in rounds[0]:
        out[shape] = {}
        for config in rounds[0][shape]:
            runs = [r[shape][config] for r in rounds if config in r.get(shape, {})]
            ok = [f for f in runs if "error" not in f]
            if not ok:
                out[shape][config] = runs[0]
                continue
            row = {key: statistics.median(f[key] for f in ok)
                   for key in ok[0] if isinstance(ok[0][key], (int, float))}
            row["errors"] = sum(f["errors"] for f in ok)
            row["error_sample"] = next((f["error_sample"] for f in ok if f["error_sample"]), [])
            row["rounds_tok_s"] = [f["output_tok_s"] for f in ok]
            row["failed_rounds"] = len(runs) - len(ok)
            out[shape][config] = row
    return out


def median_ratios(rounds: list[dict[str, dict[str, dict]]]) -> dict[str, dict]:
    """Each shape's ratios (:func:`ratios`) taken within each round, then the median over the
    rounds (each round's default against that round's best: a pair measured minutes apart,
    not hours); ``rounds_default_vs_best_tok_s`` keeps every round's figure."""
    per_round = [ratios(r) for r in rounds]
    out: dict[str, dict] = {}
    for shape in rounds[0]:
        rs = [r[shape] for r in per_round if shape in r]
        if not rs:
            continue
        merged: dict = {key: statistics.median(r[key] for r in rs if key in r)
                        for key in rs[0] if isinstance(rs[0][key], float)}
        for key in ("best_tok_s_config", "best_itl_config"):  # the configuration best most often
            names = [r[key] for r in rs]
            merged[key] = max(names, key=names.count)
        merged["rounds_default_vs_best_tok_s"] = [r["default_vs_best_tok_s"] for r in rs]
        merged["rounds_best_tok_s_config"] = [r["best_tok_s_config"] for r in rs]
        out[shape] = merged
    return out


def ratios(rows: dict[str, dict[str, dict]]) -> dict[str, dict]:
    """Per shape: the default against the best Tandem configuration (throughput and ITL p50),
    and against llama-server."""
    out: dict[str, dict] = {}
    for shape, by_config in rows.items():
        ok = {c: f for c, f in by_config.items() if "error" not in f}
        ours = {c: f for c, f in ok.items() if c in TANDEM}
        d = ok.get("default")
        if d is None or not ours:
            continue
        best_tok = max(ours.values(), key=lambda f: f["output_tok_s"])
        best_itl = min(ours.values(), key=lambda f: f["itl_p50_ms"])
        r = {"default_vs_best_tok_s": d["output_tok_s"] / best_tok["output_tok_s"],
             "default_vs_best_itl": best_itl["itl_p50_ms"] / d["itl_p50_ms"],
             "best_tok_s_config": next(c for c, f in ours.items() if f is best_tok),
             "best_itl_config": next(c for c, f in ours.items() if f is best_itl)}
        theirs = ok.get("llama-server")
        if theirs is not None and theirs["output_tok_s"] > 0:
            r["default_vs_llama_tok_s"] = d["output_tok_s"] / theirs["output_tok_s"]
            r["default_vs_llama_itl"] = theirs["itl_p50_ms"] / d["itl_p50_ms"]
        out[shape] = r
    return out


def machine(threads: int) -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text()
                .splitlines() if line.startswith("model name")), platform.processor())
    return {"cpu": cpu, "cores": len(os.sched_getaffinity(0)), "threads": threads,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--configs", type=lambda s: s.split(","), default=list(CONFIGS),
                   help=f"comma-separated, of {','.join(CONFIGS)}")
    p.add_argument("--shapes", type=lambda s: s.split(","), default=list(SHAPES),
                   help=f"comma-separated, of {','.join(SHAPES)}")
    p.add_argument("--rate", type=float, default=0.8, help="poisson: arrivals per second")
    p.add_argument("--poisson-requests", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=1,
                   help="run every configuration this many times, round by round; rows are "
                   "medians, ratios the median of each round's own (the machine drifts "
                   "between rounds less than between runs)")
    p.add_argument("--tandem-flag", action="append", default=[], metavar="FLAG",
                   help="one more flag for every tandem local configuration (repeat): a "
                   "candidate default, measured on every shape")
    p.add_argument("--aiperf", default=shutil.which("aiperf"),
                   help="aiperf's executable, for the aiperf shape (default: on PATH)")
    p.add_argument("--build", action="store_true", help="build llama.cpp when not found")
    p.add_argument("--out", type=Path, default=None, help="write load_shapes.{json,md,png} here")
    args = p.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    bad = set(args.configs) - set(CONFIGS) | set(args.shapes) - set(SHAPES)
    if bad:
        p.error(f"unknown configuration or shape: {sorted(bad)}")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if "aiperf" in args.shapes and not args.aiperf:
        note("no aiperf executable (pip install aiperf, or --aiperf PATH): its shape skipped")
        args.shapes = [s for s in args.shapes if s != "aiperf"]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # servers stop on the way out
    from tandem.engine.loader import _alias_path

    gguf = _alias_path("smollm2")
    lc = find_or_build(args.build, note) if "llama-server" in args.configs else None
    results = run(args, lc, gguf)
    from bench.serving.load_shapes_report import markdown, plot, table

    print(table(results))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "load_shapes.json").write_text(json.dumps(results, indent=2))
        (args.out / "load_shapes.md").write_text(markdown(results))
        plot(results, args.out / "load_shapes.png")
        note(f"wrote {args.out}/load_shapes.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
