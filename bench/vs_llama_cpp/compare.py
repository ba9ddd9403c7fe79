"""Tandem against llama.cpp in one run: the same GGUF file, the same thread count.

    python -m bench.vs_llama_cpp.compare [--threads 2] [--quick] [--out docs/bench] [--build]

The model is the default one, the GGUF behind the alias ``smollm2`` (SmolLM2-135M-Instruct
Q4_1). llama.cpp's binaries come from bench/vs_llama_cpp/binaries.py (``--build`` builds them when none
are found: up to ~20 min more on 2 cores); without them only our side runs. Rows, both sides each:

    decode 1 stream (engine)  llama-bench tg128          our engine.LLM: one greedy stream of
                                                         128 tokens, ms/token after the first
    prefill 512 (engine)      llama-bench pp512          TTFT of a 512-token prompt
    decode 32 seqs (engine)   llama-batched-bench S_TG   32 x (128 in, 128 out): output tok/s
                              (-npp 128 -ntg 128 -npl 32) of the steps after every prefill
    HTTP 1 stream (TPOT)      llama-server               `tandem local` (what users start),
    HTTP 32 streams (tok/s)   -t T -np 32 -cb -c 32*320  both driven by one streaming
                                                         /v1/completions client, 128 in/128 out

Engine rows use the engine's defaults apart from threads. For the HTTP rows both servers run
on the same T cores (taskset when T is fewer than this process may use), and `tandem local`
splits those cores between its workers as it does for a user. Every request is greedy with
``ignore_eos`` (fixed lengths on both sides). Targets (ours / llama.cpp): single-stream
decode >= 1.3x (engine and HTTP), 32 concurrent HTTP >= 1.5x, batched decode-only 32 >= 1.5x,
prefill 512 >= 2x. Writes vs_llama_cpp.{json,png,md} into ``--out``. A full run takes ~6-10
minutes on 2 cores; ``--quick`` (fewer tokens, one repeat) is a smoke run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import random
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.vs_llama_cpp.binaries import LlamaCpp, find_or_build
from bench.vs_llama_cpp.theirs import ServerError, wait_http_ok
from tandem.loadgen.load import run_openai
from tandem.loadgen.workload import RequestSpec

ROOT = Path(__file__).resolve().parents[2]
T0 = time.monotonic()


def note(msg: str) -> None:
    print(f"[vs-llama.cpp {time.monotonic() - T0:5.0f} s] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class Plan:
    """Sizes of every row (the full run's are the comparison's; --quick shrinks them)."""

    decode_tokens: int = 128
    prefill_tokens: int = 512
    batch_seqs: int = 32
    batch_prompt: int = 128
    batch_output: int = 128
    http_prompt: int = 128
    http_output: int = 128
    http_streams: int = 32
    repeats: int = 3


QUICK = Plan(decode_tokens=32, batch_prompt=32, batch_output=32, http_prompt=32,
             http_output=32, repeats=1)
TARGETS = {"decode": 1.3, "prefill": 2.0, "batched": 1.5, "http_single": 1.3,
           "http_concurrent": 1.5}


def _row(key: str, label: str, ours: float | None, theirs: float | None,
         ours_ms: float | None = None, theirs_ms: float | None = None) -> dict:
    ratio = ours / theirs if ours and theirs else None
    return {"key": key, "label": label, "ours": ours, "theirs": theirs, "ours_ms": ours_ms,
            "theirs_ms": theirs_ms, "ratio": ratio, "target": TARGETS[key]}


def _ms(tok_s: float | None) -> float | None:
    return 1e3 / tok_s if tok_s else None


# -- the HTTP rows -----------------------------------------------------------------------------

def _prompts(count: int, length: int, seed: int) -> list[tuple[int, ...]]:
    """Random token ids (the range `tandem bench` uses), the same for both servers."""
    rng = random.Random(seed)
    return [tuple(rng.randrange(1000, 30000) for _ in range(length)) for _ in range(count)]


def measure_http(base_url: str, plan: Plan, who: str) -> dict:
    """Single-stream TPOT (median of repeats) and output tok/s of ``http_streams`` at once."""
    n_in, n_out = plan.http_prompt, plan.http_output

    def load(prompts: list[tuple[int, ...]], out: int) -> tuple[list, float]:
        specs = [RequestSpec(i, 0.0, "bench", p, out) for i, p in enumerate(prompts)]
        results, wall = asyncio.run(run_openai(base_url, specs, timeout_s=600.0))
        bad = [r for r in results if not r.ok or r.output_tokens != out]
        if bad:
            raise ServerError(f"{who}: {len(bad)} of {len(results)} requests failed or came "
                                f"back short: {bad[0].error or bad[0].output_tokens}")
        return results, wall

    load(_prompts(2, n_in, seed=7), 8)  # warm-up: first-call costs, not measured prompts
    note(f"{who}: 1 stream x{plan.repeats} ({n_in} in, {n_out} out)")
    tpots = [load([p], n_out)[0][0].tpot for p in _prompts(plan.repeats, n_in, seed=8)]
    tpot_ms = 1e3 * statistics.median(tpots)
    note(f"  TPOT {tpot_ms:.2f} ms")
    rates, ttfts = [], []
    for k in range(plan.repeats):
        note(f"{who}: {plan.http_streams} concurrent streams, run {k + 1}/{plan.repeats}")
        results, wall = load(_prompts(plan.http_streams, n_in, seed=20 + k), n_out)
        rates.append(sum(r.output_tokens for r in results) / wall)
        ttfts.append(statistics.median(r.ttft for r in results))
    note(f"  {statistics.median(rates):.1f} output tok/s")
    return {"tpot_ms": tpot_ms, "concurrent_tok_s": statistics.median(rates),
            "concurrent_ttft_p50_s": statistics.median(ttfts)}


def pin(threads: int) -> tuple[str, ...]:
    """taskset prefix that keeps a server on ``threads`` of our cores (none when it has all)."""
    cores = sorted(os.sched_getaffinity(0))
    if threads >= len(cores):
        return ()
    return ("taskset", "-c", ",".join(str(c) for c in cores[:threads]))


@contextmanager
def tandem_local(wrap: Sequence[str], flags: Sequence[str] = (),
                 ready_s: float = 120.0) -> Iterator[str]:
    """``tandem local`` (its defaults, plus ``flags``) on free ports until the block ends; its
    HTTP base URL, once the router answers /ready (both workers registered)."""
    from tandem.launcher.local_cluster import Cluster

    cluster = Cluster()
    try:
        proc = cluster.start("tandem.launcher.local", "--port", "0", *flags, wrap=wrap)
        base = f"http://{proc.info['http']}"
        wait_http_ok(f"{base}/ready", lambda: proc.popen.poll() is None, ready_s, "tandem local")
        yield base
    finally:
        cluster.stop()


def _local_split(threads: int) -> str:
    from tandem.launcher.local import thread_split

    prefill, decode = thread_split(min(threads, len(os.sched_getaffinity(0))))
    return (f"prefill worker {prefill} threads, decode worker {decode}, borrowing "
            f"{max(prefill, decode)} for its steps while the prefill worker is idle")


# -- the run -------------------------------------------------------------------------------------

def _engine_rows(threads: int, plan: Plan) -> tuple[dict, str]:
    """Our engine rows (run in a child process) and the weights' format."""
    from bench.vs_llama_cpp import ours as ours_side

    note(f"our engine: loading smollm2 ({threads} threads, engine defaults)")
    llm = ours_side.load(threads)
    note(f"  weights {llm.engine.weights_format}, {llm.engine.weight_bytes / 1e6:.0f} MB")
    rows = ours_side.run_ours(
        llm, plan.decode_tokens, plan.prefill_tokens,
        (plan.batch_seqs, plan.batch_prompt, plan.batch_output), plan.repeats, note)
    return rows, str(llm.engine.weights_format)


def run(args: argparse.Namespace, lc: LlamaCpp | None, gguf: Path) -> dict:
    """Every row on both sides; the JSON-ready results."""
    from bench.vs_llama_cpp import theirs as theirs_side

    plan = QUICK if args.quick else Plan()
    if args.repeats:
        plan = Plan(**{**asdict(plan), "repeats": args.repeats})
    t, notes = args.threads, []
    ours: dict = {}
    theirs: dict = {}
    # The engine rows run in a child process: this one drives both HTTP servers afterwards,
    # and an engine's leftovers in the client's process (torch's thread pools) slowed the
    # streams it read by a quarter (single-stream TPOT through tandem local: 5.6 ms with
    # them, 4.2 ms without, back to back).
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as child:
        ours["engine"], ours["weights_format"] = child.submit(_engine_rows, t, plan).result()
    if lc is not None:
        note(f"llama-bench pp{plan.prefill_tokens} tg{plan.decode_tokens} x{plan.repeats}")
        theirs["bench"] = theirs_side.llama_bench(lc, gguf, t, plan.prefill_tokens,
                                                  plan.decode_tokens, plan.repeats)
        note(f"  pp {theirs['bench']['pp_tok_s']:.0f} tok/s, "
             f"tg {theirs['bench']['tg_ms_per_tok']:.2f} ms/token")
        note(f"llama-batched-bench {plan.batch_seqs} x ({plan.batch_prompt} in, "
             f"{plan.batch_output} out) x{plan.repeats}")
        theirs["batched"] = theirs_side.batched_bench(
            lc, gguf, t, plan.batch_prompt, plan.batch_output, plan.batch_seqs, plan.repeats)
        note(f"  S_TG {theirs['batched']['tok_s']:.1f} tok/s")
    wrap = pin(t)
    if lc is not None:
        note(f"llama-server -t {t} -np {plan.http_streams} -cb: starting")
        try:
            with theirs_side.llama_server(lc, gguf, t, plan.http_streams, wrap) as base:
                theirs["http"] = measure_http(base, plan, "llama-server")
        except RuntimeError as exc:  # ServerError, or a llama.cpp failure
            notes.append(f"llama-server rows failed: {exc}".splitlines()[0])
            note(str(exc))
    note("tandem local: starting (router + prefill + decode workers)")
    try:
        with tandem_local(wrap) as base:
            ours["http"] = measure_http(base, plan, "tandem local")
    except RuntimeError as exc:  # ServerError, or Cluster.start's: a process did not start
        notes.append(f"tandem local rows failed: {exc}".splitlines()[0])
        note(str(exc))
    return _results(args, plan, lc, gguf, ours, theirs, notes)


def _results(args: argparse.Namespace, plan: Plan, lc: LlamaCpp | None, gguf: Path,
             ours: dict, theirs: dict, notes: list[str]) -> dict:
    eng, tb = ours["engine"], theirs.get("bench", {})
    oh, th = ours.get("http", {}), theirs.get("http", {})
    rows = [
        _row("decode", f"decode 1 stream, {plan.decode_tokens} tok (engine)",
             1e3 / eng["decode"]["ms_per_tok"], tb.get("tg_tok_s"),
             eng["decode"]["ms_per_tok"], tb.get("tg_ms_per_tok")),
        _row("prefill", f"prefill {plan.prefill_tokens} (engine)", eng["prefill"]["tok_s"],
             tb.get("pp_tok_s")),
        _row("batched", f"decode {plan.batch_seqs} seqs (engine)", eng["batched"]["tok_s"],
             theirs.get("batched", {}).get("tok_s")),
        _row("http_single", "HTTP 1 stream (TPOT)", _ms(oh.get("tpot_ms")),
             _ms(th.get("tpot_ms")), oh.get("tpot_ms"), th.get("tpot_ms")),
        _row("http_concurrent", f"HTTP {plan.http_streams} streams (output tok/s)",
             oh.get("concurrent_tok_s"), th.get("concurrent_tok_s")),
    ]
    if lc is None:
        notes.append("llama.cpp binaries not found: only our side ran "
                     "(python -m bench.vs_llama_cpp.binaries --build)")
    if args.quick:
        notes.append("--quick: smoke-run sizes and one repeat; not a measurement")
    notes.append(f"HTTP rows: llama-server runs all {args.threads} threads for prefill and "
                 f"decode; tandem local splits the same cores as it does by default "
                 f"({_local_split(args.threads)})")
    return {
        "command": "python -m bench.vs_llama_cpp.compare " + shlex.join(args.argv),
        "machine": _machine(), "threads": args.threads, "gguf": str(gguf),
        "plan": asdict(plan), "tandem_local_threads": _local_split(args.threads),
        "llama_cpp": {"found_in": lc.found_in, "version": lc.version()} if lc else None,
        "rows": rows, "ours": ours, "theirs": theirs, "notes": notes,
    }


def _machine() -> dict:
    import psutil
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                   if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                                capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        commit = ""
    from tandem.engine.native import isa

    return {"cpu": cpu, "cores": len(os.sched_getaffinity(0)),
            "memory_gb": psutil.virtual_memory().total / 1e9, "python": platform.python_version(),
            "torch": torch.__version__, "commit": commit or "unknown",
            "native_isa": isa() or "none (torch ops)"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                allow_abbrev=False, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="threads on both sides (default: every core this process may use)")
    p.add_argument("--quick", action="store_true", help="fewer tokens, one repeat (smoke run)")
    p.add_argument("--repeats", type=int, default=0, help="runs per row (default 3; quick 1)")
    p.add_argument("--build", action="store_true", help="build llama.cpp when not found")
    p.add_argument("--out", type=Path, default=None,
                   help="write vs_llama_cpp.{json,png,md} here")
    args = p.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    # SIGTERM unwinds like Ctrl-C, so every server started here is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from tandem.engine.loader import _alias_path

    gguf = _alias_path("smollm2")
    lc = find_or_build(args.build, note)
    results = run(args, lc, gguf)
    from bench.vs_llama_cpp.report import markdown, plot, table

    print(table(results["rows"]))
    for n in results["notes"]:
        print(f"note: {n}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "vs_llama_cpp.json").write_text(json.dumps(results, indent=2))
        (args.out / "vs_llama_cpp.md").write_text(markdown(results))
        plot(results, args.out / "vs_llama_cpp.png")
        note(f"wrote {args.out}/vs_llama_cpp.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
