"""How much do a prefill and a decode engine on one host slow each other down?

    python -m bench.serving.host_contention [--rows 1,2,4,8,16,32] \\
        [--out docs/bench/host_contention.json]

The simulator's host-sharing model (tandem/planner/sim/host.py) needs two factors: a decode step's
length while the co-located prefill worker computes, over its length alone (at each batch
size); and the same for a prefill while the decode worker steps. This runs the two real
engines in two processes in ``scripts/bench_serve``'s disaggregated layout (decode: 1
thread pinned to the last core; prefill: ``--prefill-threads`` threads, unpinned, or with
one thread pinned to the first core, a core each) over four phases of
``--seconds`` S each, for each batch size::

    0 .. S      decode steps alone (R rows, greedy, never finishing)
    S .. 3S     decode steps while the prefill engine runs prompts back to back
    3S .. 4S    the prefill engine alone (the decode process has stopped)

and prints the median step and prefill times of each phase, their ratios, and the
``--host-sharing DECODE,PREFILL`` flag for bench.planner.validation: the decode factor by
batch size (``1:2.4/8:1.9``, linear in between) where several row counts ran, the prefill
factor the mean over them. Both processes load and warm up first, then start together on a
signal; steps that straddle a phase boundary are left out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tandem.planner.sim.host import HostSharing

EDGE_S = 0.25  # margin left out after each phase starts


def _decode(args: argparse.Namespace) -> list[tuple[float, float]]:
    from tandem.engine import LLM, SamplingParams

    llm = LLM(args.model, progress=False, num_threads=args.decode_threads)
    eng, rng = llm.engine, random.Random(1)
    for _ in range(args.rows):
        eng.add_request([rng.randrange(1000, 30000) for _ in range(64)],
                        SamplingParams(max_tokens=10**6, temperature=0.0, ignore_eos=True))
    for _ in range(4):
        eng.step()
    t0 = _ready_then_go()
    rec = []
    while time.time() < t0 + 3 * args.seconds:
        start = time.perf_counter()
        eng.step()
        rec.append((time.time() - t0, time.perf_counter() - start))
    return rec


def _prefill(args: argparse.Namespace) -> list[tuple[float, float]]:
    from tandem.engine import LLM, SamplingParams

    llm = LLM(args.model, progress=False, num_threads=args.prefill_threads)
    eng, rng = llm.engine, random.Random(2)

    def one() -> float:
        start = time.perf_counter()
        eng.add_request([rng.randrange(1000, 30000) for _ in range(args.prompt)],
                        SamplingParams(max_tokens=1))
        while eng.has_unfinished():
            eng.step()
        return time.perf_counter() - start

    one()  # warm
    t0 = _ready_then_go()
    while time.time() < t0 + args.seconds:
        time.sleep(0.001)  # phase 1: the decode engine runs alone
    rec = []
    while time.time() < t0 + 4 * args.seconds:
        began = time.time() - t0
        rec.append((began, one()))
    return rec


def _ready_then_go() -> float:
    """Tell the parent this process is loaded; return the start time it sends back."""
    print("ready", flush=True)
    return float(sys.stdin.readline())


def analyse(decode: list[tuple[float, float]], prefill: list[tuple[float, float]],
            seconds: float) -> dict[str, Any]:
    """Median times per phase and their ratios. ``decode``: (step end, seconds) since the
    start; ``prefill``: (prompt start, seconds)."""
    s = seconds
    d_alone = [d for end, d in decode if EDGE_S <= end - d and end <= s]
    d_both = [d for end, d in decode if s + EDGE_S <= end - d and end <= 3 * s]
    p_both = [d for began, d in prefill if s <= began and began + d <= 3 * s]
    p_alone = [d for began, d in prefill if 3 * s + EDGE_S <= began]
    if not (d_alone and d_both and p_both and p_alone):
        raise ValueError("a phase has no complete step: run longer (--seconds)")
    med = statistics.median
    return {"decode_step_s": {"alone": med(d_alone), "with_prefill": med(d_both),
                              "steps": [len(d_alone), len(d_both)]},
            "prefill_s": {"alone": med(p_alone), "with_decode": med(p_both),
                          "prompts": [len(p_alone), len(p_both)]},
            "decode_slowdown": med(d_both) / med(d_alone),
            "prefill_slowdown": med(p_both) / med(p_alone)}


def sharing(runs: list[dict[str, Any]]) -> HostSharing:
    """The host model of a set of runs: the decode factor by rows (one run: one factor), the
    prefill factor their mean; a factor under 1 (noise) counts as 1."""
    by_rows = sorted((r["rows"], max(r["decode_slowdown"], 1.0)) for r in runs)
    prefill = max(statistics.mean(r["prefill_slowdown"] for r in runs), 1.0)
    if len(by_rows) == 1:
        return HostSharing(by_rows[0][1], prefill)
    return HostSharing(tuple(by_rows), prefill)


def _child(role: str, args: argparse.Namespace) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "bench.serving.host_contention", "--role", role,
            "--rows", str(args.rows), "--model", args.model, "--seconds", str(args.seconds),
            "--prompt", str(args.prompt), "--decode-threads", str(args.decode_threads),
            "--prefill-threads", str(args.prefill_threads)]
    cpus = sorted(os.sched_getaffinity(0))
    if role == "decode" and len(cpus) >= 2:
        argv = ["taskset", "-c", str(cpus[-1]), *argv]
    elif role == "prefill" and len(cpus) >= 2 and args.prefill_threads == 1:
        argv = ["taskset", "-c", str(cpus[0]), *argv]  # a core of its own, as bench_serve's
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def measure(args: argparse.Namespace, rows: int) -> dict[str, Any]:
    """One run of the four phases with ``rows`` decode rows."""
    args = argparse.Namespace(**{**vars(args), "rows": rows})
    procs = {role: _child(role, args) for role in ("decode", "prefill")}
    try:
        for role, proc in procs.items():
            assert proc.stdout is not None and proc.stdin is not None
            for line in proc.stdout:  # the loader may print first (a first load converts)
                if line.strip() == "ready":
                    break
                print(line, end="", file=sys.stderr, flush=True)
            else:
                raise RuntimeError(f"the {role} process failed to start")
        t0 = time.time() + 0.5
        for proc in procs.values():
            assert proc.stdin is not None
            proc.stdin.write(f"{t0}\n")
            proc.stdin.flush()
        out = {role: json.loads(proc.communicate(timeout=60 + 8 * args.seconds)[0])
               for role, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {"rows": rows, **analyse(out["decode"], out["prefill"], args.seconds)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1,2,4,8,16,32",
                   help="decode batch sizes, comma-separated")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--seconds", type=float, default=8.0, help="length of each phase")
    p.add_argument("--prompt", type=int, default=512, help="prefill prompt tokens")
    p.add_argument("--decode-threads", type=int, default=1)
    p.add_argument("--prefill-threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="write the results here (JSON)")
    p.add_argument("--role", choices=("decode", "prefill"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.role is not None:  # a child: run one side, print its records
        args.rows = int(args.rows)
        rec = (_decode if args.role == "decode" else _prefill)(args)
        print(json.dumps(rec), flush=True)
        return 0
    runs = []
    for rows in (int(r) for r in args.rows.split(",")):
        print(f"[host_contention] {rows} decode row(s): loading both engines, then "
              f"{4 * args.seconds:.0f} s of phases ...", file=sys.stderr, flush=True)
        run = measure(args, rows)
        runs.append(run)
        d, pf = run["decode_step_s"], run["prefill_s"]
        print(f"rows {rows:3d}: decode step {1e3 * d['alone']:.1f} ms alone, "
              f"{1e3 * d['with_prefill']:.1f} ms with prefill ({run['decode_slowdown']:.2f}x); "
              f"prefill {args.prompt} {pf['alone']:.2f} s alone, {pf['with_decode']:.2f} s "
              f"with decode ({run['prefill_slowdown']:.2f}x)", flush=True)
    flag = sharing(runs).flag()
    print(f"--host-sharing {flag}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"config": {k: v for k, v in vars(args).items()
                                                   if k not in ("out", "role")},
                                        "runs": runs, "host_sharing": flag}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
