"""``tandem local``: a whole cluster on this machine without Ray (what ``make serve`` runs).

Starts one decode worker, one prefill worker and the router as separate processes on the
default model, waits until each is serving, prints the endpoint and a command to try, and on
Ctrl-C (or SIGTERM) drains and stops all three. The three share a cluster credential made for
this run (a 0600 file in a private folder, removed at exit): nothing else can call the
workers or join the router.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import threading
from pathlib import Path

from common.arg_parser import ArgParser
from common.wire import ready_line
from tandem.engine_flags import (
    add_launcher_engine_args,
    add_observability_args,
    add_passthrough_args,
    observability_argv,
    router_engine_argv,
    worker_engine_argv,
)
from tandem.invocation import tandem_command
from tandem.local_cluster import Cluster


def build_parser() -> argparse.ArgumentParser:
    """Flags of ``tandem local``."""
    p = ArgParser(prog="tandem local", description=__doc__, config_file=True)
    p.add_argument("--model", default="smollm2", help="alias, HF directory or .gguf file")
    p.add_argument("--model-name", "--served-model-name", dest="model_name", default="",
                   help="served model id (default: --model as given)")
    p.add_argument("--port", type=int, default=50051, help="router gRPC port")
    p.add_argument("--http-port", type=int, default=None,
                   help="router OpenAI HTTP port (default 8000; a free one when --port is 0)")
    prefill, decode = thread_split(len(os.sched_getaffinity(0)))
    p.add_argument("--prefill-threads", type=int, default=prefill,
                   help=f"prefill worker threads (default: every core, {prefill})")
    p.add_argument("--decode-threads", type=int, default=decode,
                   help=f"decode worker threads (default: a quarter of the cores, {decode})")
    p.add_argument("--no-prefill", action="store_true", help="colocated: decode worker only")
    p.add_argument("--cluster-secret-file", default=None,
                   help="the cluster credential to use (default: a new one, removed at exit)")
    p.add_argument("--insecure", action="store_true",
                   help="no credential: any local user can act on the cluster's ports")
    add_passthrough_args(p)
    add_observability_args(p)
    add_launcher_engine_args(p)
    return p


def worker_argv(args: argparse.Namespace, model: str, threads: int) -> list[str]:
    """Flags both workers get (the caller adds the role's ports): the model, threads, the
    engine, logging and tracing flags given, then ``--worker-arg``s (last, so they win)."""
    return ["--model", model, "--threads", str(threads), *worker_engine_argv(args),
            *observability_argv(args), *args.worker_arg]


def router_argv(args: argparse.Namespace, model_dir: Path) -> list[str]:
    """The router's flags but its workers and ports: the tokenizer, the served name, the
    engine flags it shares with the workers, the logging and tracing flags, then
    ``--router-arg``s."""
    return ["--tokenizer", str(model_dir), "--model-name", args.model_name or args.model,
            *router_engine_argv(args), *observability_argv(args), *args.router_arg]


def thread_split(cores: int) -> tuple[int, int]:
    """(prefill, decode) threads for two workers sharing ``cores``.

    Prefill is compute-bound and bursty, decode memory-bound and steady: the prefill worker
    gets every core (its bursts then run at the machine's full speed) and the decode worker a
    quarter of them, which it shares. Measured on 2 cores (docs/bench/serve.md, runs 6-8): a
    512-token prefill chunk takes 1.18 s on 2 threads against 2.05 s on 1; serving the
    RAG/chat mix at 0.2 req/s, 2+1 threads kept 80% of requests inside the SLO where 1+1
    kept 65%, with TPOT p99 65 vs 63 ms (one 20-request point each)."""
    return max(cores, 1), max(cores // 4, 1)


def main(argv: list[str] | None = None) -> int:
    """Run the local cluster until interrupted."""
    args = build_parser().parse_args(argv)
    from engine.errors import ModelLoadError
    from engine.loader import resolve_model

    try:
        model_dir = resolve_model(args.model)  # converts a GGUF once, before workers start
    except ModelLoadError as exc:
        print(f"tandem local: {exc}", file=sys.stderr)
        return 2
    try:
        cluster = Cluster(echo=True, credential_flags=_credential_flags(args))
    except ValueError as exc:
        print(f"tandem local: {exc}", file=sys.stderr)
        return 2
    # Workers get the model as the user named it (an alias or a .gguf keeps the file's own
    # quantized blocks: engine/quant "auto"); their resolve finds the conversion done above.
    spec = str(Path(args.model).resolve()) if Path(args.model).exists() else args.model
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        print("[tandem] starting decode worker ...", file=sys.stderr, flush=True)
        decode = cluster.start("decode_worker", "--port", "0", "--kv-port", "0",
                               *worker_argv(args, spec, args.decode_threads))
        prefill_flags: list[str] = []
        if not args.no_prefill:
            print("[tandem] starting prefill worker ...", file=sys.stderr, flush=True)
            prefill = cluster.start("prefill_worker", "--port", "0",
                                    *worker_argv(args, spec, args.prefill_threads))
            prefill_flags = ["--prefill", prefill.grpc]
        print("[tandem] starting router ...", file=sys.stderr, flush=True)
        router = cluster.start("router", "--port", str(args.port), "--decode", decode.grpc,
                               *prefill_flags, "--http-port", str(_http_port(args)),
                               *router_argv(args, model_dir))
        example = f"{tandem_command()} generate --chat --target " + shlex.quote(router.grpc)
        http = str(router.info.get("http", ""))
        print(f"\nTandem is serving {args.model_name or args.model} on grpc://{router.grpc}",
              flush=True)
        if http:
            print(f"OpenAI-compatible API: http://{http}/v1", flush=True)
        print(f"Try it:  {example} \"Write a haiku about the sea\"", flush=True)
        print("Ctrl-C drains and stops the cluster.", flush=True)
        info = {"role": "local", "grpc": router.grpc, **({"http": http} if http else {})}
        print(ready_line(info), end="", flush=True)
        stop.wait()
    except KeyboardInterrupt:
        pass
    except RuntimeError as exc:  # a process failed to start
        print(f"tandem local: {exc}", file=sys.stderr)
        return 1
    finally:
        print("\n[tandem] draining and stopping ...", file=sys.stderr, flush=True)
        cluster.stop()
    return 0


def _credential_flags(args: argparse.Namespace) -> list[str] | None:
    """The credential flags of every process: the file the user named, ``--insecure``, or
    None for a new credential made for this run (``Cluster`` makes and removes it)."""
    if args.insecure:
        if args.cluster_secret_file:
            raise ValueError("--cluster-secret-file and --insecure exclude each other")
        return ["--insecure"]
    if args.cluster_secret_file:
        return ["--cluster-secret-file", args.cluster_secret_file]  # Cluster checks the file
    return None


def _http_port(args: argparse.Namespace) -> int:
    if args.http_port is not None:
        return int(args.http_port)
    return 0 if args.port == 0 else 8000


if __name__ == "__main__":
    raise SystemExit(main())
