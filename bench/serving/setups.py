"""The setups scripts/bench_serve compares, as processes: what each starts, pinned where.

    disagg             router + prefill worker (core 0) + decode worker (core 1); the router
                       places each prompt (adaptive placement, the default)
    disagg-remote      the same, every prompt prefilled remotely (``--placement remote``)
    colocated          router + one decode worker on both cores, prefilling locally
    colocated-chunked  the same with a 256-token step budget (prefill chunked between steps)

``cores`` N (even) lays the same setups over N cores: the prefill worker on the first half,
the decode worker on the second, a colocated worker on all N (core_split). Every worker
serves /metrics (a point reads how busy it was) and, with a logs folder, logs its steps.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.serving.logs import placement_log_path, step_log_path
from tandem.launcher.local_cluster import Cluster, Proc
from tandem.loadgen.load import run_load
from tandem.loadgen.workload import RequestSpec

METRICS = ("--metrics-port", "0")  # each worker's /metrics: how busy it was at each point


def _engine_flags(model: str, threads: int, extra: list[str]) -> list[str]:
    # The model as the user names it, in its own format (a GGUF's blocks: what `make serve`
    # runs); --engine-arg=--quantization=none benchmarks the dequantized weights instead.
    return ["--model", model, "--threads", str(threads), *extra]


def core_split(cores: int) -> tuple[str, str, str]:
    """``--cores N``'s pinning (taskset lists): the prefill worker's first half, the decode
    worker's second half, a colocated worker's all N."""
    if cores < 2 or cores % 2:
        raise ValueError(f"--cores needs an even number >= 2 (got {cores})")
    half = cores // 2
    return f"0-{half - 1}", f"{half}-{cores - 1}", f"0-{cores - 1}"


def start_setup(
    cluster: Cluster, name: str, model_dir: Path, engine_extra: list[str],
    router_extra: Sequence[str] = (), prefill_threads: int = 1, model: str = "",
    step_logs: Path | None = None, cores: int = 0,
) -> dict[str, Proc]:
    """Start one setup's processes; returns them by role. ``router_extra``: router flags
    (the SLO the placement keeps, the same targets the benchmark scores against). ``model``:
    what the workers load (default: ``model_dir``, which the router's tokenizer reads).
    ``prefill_threads`` > 1: the prefill worker runs that many threads on every core (the
    decode worker keeps core 1, which it then shares). ``step_logs``: a folder where each
    worker logs its steps (``--step-log ROLE.jsonl``: step_log_path). ``cores`` N > 0: the
    prefill worker on cores 0..N/2-1 and the decode worker on N/2..N-1, N/2 threads each, a
    colocated worker on all N with N threads (``prefill_threads`` ignored; core_split)."""
    pin = len(os.sched_getaffinity(0)) >= 2
    model = model or str(model_dir)
    core0 = ("taskset", "-c", "0") if pin and prefill_threads == 1 else ()
    core1 = ("taskset", "-c", "1") if pin else ()
    decode_threads, colocated_threads, colocated_pin = 1, 2, ()
    if cores:
        first, second, every = core_split(cores)
        core0, core1 = ("taskset", "-c", first), ("taskset", "-c", second)
        prefill_threads = decode_threads = cores // 2
        colocated_threads, colocated_pin = cores, ("taskset", "-c", every)
    procs: dict[str, Proc] = {}

    def log(role: str) -> list[str]:
        return [] if step_logs is None else ["--step-log", str(step_log_path(step_logs, role))]

    if name.startswith("disagg"):
        procs["decode"] = cluster.start(
            "tandem.worker.decode", "--port", "0", "--kv-port", "0", *METRICS, *log("decode"),
            *_engine_flags(model, decode_threads, engine_extra), wrap=core1,
        )
        procs["prefill"] = cluster.start(
            "tandem.worker.prefill", "--port", "0", *METRICS, *log("prefill"),
            *_engine_flags(model, prefill_threads, engine_extra),
            wrap=core0,
        )
    else:
        budget = ["--max-num-batched-tokens", "256"] if name == "colocated-chunked" else []
        procs["decode"] = cluster.start(
            "tandem.worker.decode", "--port", "0", "--kv-port", "0", *METRICS, *log("decode"),
            *_engine_flags(model, colocated_threads, engine_extra + budget), wrap=colocated_pin,
        )
    prefill = ["--prefill", procs["prefill"].grpc] if "prefill" in procs else []
    if name == "disagg-remote":
        prefill += ["--placement", "remote"]
    placements = [] if step_logs is None else ["--placement-log",
                                               str(placement_log_path(step_logs))]
    procs["router"] = cluster.start(
        "tandem.router", "--port", "0", "--http-port", "0", "--tokenizer", str(model_dir),
        "--model-name", "bench",
        "--decode", procs["decode"].grpc, *prefill, *router_extra, *placements,
    )
    return procs


def start_warm(cluster: Cluster, name: str, model_dir: Path, args: argparse.Namespace,
               warmup: list[RequestSpec], step_logs: Path | None = None) -> dict[str, Proc]:
    """Start a setup with the scored SLO on its router, then send one throwaway request (not
    one of the measured ones: no prefix-cache head start) that warms every process
    (first-call allocations, JIT paths). ``step_logs``: start_setup's."""
    print(f"[bench] starting {name} ...", file=sys.stderr, flush=True)
    slo = ["--slo-ttft-s", str(args.slo_ttft), "--slo-tpot-s", str(args.slo_tpot)]
    procs = start_setup(cluster, name, model_dir, args.engine_arg, slo, args.prefill_threads,
                        args.model, step_logs, args.cores)
    asyncio.run(run_load(procs["router"].grpc, warmup))
    return procs
