"""``tandem local``: a whole cluster on this machine without Ray (what ``make serve`` runs).

Starts the decode workers, the prefill workers (one of each by default; ``--num-decode``,
``--num-prefill``, 0 prefill workers for a colocated cluster) and the router as separate
processes on the default model, waits until each is serving, prints the endpoints (the API,
and each process's Prometheus /metrics) and a command to try, and on Ctrl-C (or SIGTERM)
drains and stops them all: the start too, when it comes before every worker is ready. The
processes share a cluster credential made for this run (a 0600 file in a private folder,
removed at exit): nothing else can call the workers or join the router. API keys
(``--api-key``, ``--api-key-file``) reach the router in another such file, never on its
command line.

LoRA (vLLM's flags): ``--enable-lora``, ``--lora-modules``, ``--max-loras``,
``--max-lora-rank`` and ``--max-cpu-loras`` reach every worker of both roles (a prefill
worker must hold the adapter the decode worker checks at the KV handoff), the adapter
directories as absolute paths (the processes run in the project's folder, not the caller's);
``--allow-runtime-lora-updates`` reaches every worker and the router, whose admin routes
(``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``) then open with a key of
``--admin-key-file`` only.

Cores: one prefill and one decode worker lay out as :func:`thread_split` says and the decode
worker borrows the prefill worker's cores while they are idle (tandem/worker/core_lending.py,
built for that one pair). With more workers the cores are divided among them, at least one
thread each, and no cores are lent. ``--flippable`` starts workers that can switch roles
(``tandem flip``; tandem/worker/dual/), with no cores lent.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tandem.cli.invocation import tandem_command
from tandem.common.arg_parser import ArgParser
from tandem.common.model_spec import served_name as default_served_name
from tandem.common.router_ports import router_http_port
from tandem.common.wire import ready_line
from tandem.launcher import tensor_parallel
from tandem.launcher.api_keys import (
    add_admin_key_arg,
    add_api_key_args,
    admin_key_argv,
    key_file_text,
    write_key_file,
)
from tandem.launcher.engine_flags import (
    add_launcher_engine_args,
    add_observability_args,
    add_passthrough_args,
    add_router_output_args,
    observability_argv,
    router_engine_argv,
    worker_engine_argv,
)
from tandem.launcher.local_cluster import Cluster
from tandem.worker.core_lending import make_core_share_file


def build_parser() -> argparse.ArgumentParser:
    """Flags of ``tandem local``."""
    p = ArgParser(prog="tandem local", description=__doc__, config_file=True)
    p.add_argument("--model", default="smollm2", help="alias, HF directory or .gguf file")
    p.add_argument("--model-name", "--served-model-name", dest="model_name", default="",
                   help="served model id (default: the alias, the .gguf file's stem or the "
                   "directory's name)")
    p.add_argument("--port", type=int, default=50051, help="router gRPC port")
    p.add_argument("--http-port", type=int, default=None,
                   help="router OpenAI HTTP port (default 8000; a free one when --port is 0 "
                   "or 8000 itself)")
    p.add_argument("--num-prefill", type=int, default=1, metavar="N",
                   help="prefill workers (default 1; 0: colocated, the decode workers prefill)")
    p.add_argument("--no-prefill", dest="num_prefill", action="store_const", const=0,
                   help="colocated: decode workers only (--num-prefill 0)")
    p.add_argument("--num-decode", type=int, default=1, metavar="M",
                   help="decode workers (default 1)")
    prefill, decode = thread_split(len(os.sched_getaffinity(0)))
    p.add_argument("--prefill-threads", type=int, default=None,
                   help=f"threads of each prefill worker (default with one prefill and one "
                   f"decode worker: every core, {prefill}; with more workers: the cores divided "
                   "among all of them, at least 1 each, so 1 each when there are more workers "
                   "than cores)")
    p.add_argument("--decode-threads", type=int, default=None,
                   help=f"threads of each decode worker (default with one of each: a quarter of "
                   f"the cores, {decode}, borrowing the prefill worker's while it is idle; a "
                   "lone decode worker: every core; more workers: the cores divided, as for "
                   "--prefill-threads)")
    p.add_argument("--no-core-share", action="store_true",
                   help="the decode worker keeps to its own threads (by default, with one "
                   "prefill and one decode worker, it may run a step on every core while the "
                   "prefill worker is idle, when that measures faster: "
                   "tandem/worker/core_lending.py; off with more workers)")
    p.add_argument("--flippable", action="store_true",
                   help="workers that can switch between prefill and decode with their weights "
                   "loaded (tandem flip WORKER --to ROLE; tandem/worker/dual/); core lending "
                   "is then off (its lender and borrower are the two roles)")
    p.add_argument("--worker-metrics-port", type=int, default=0,
                   help="workers' Prometheus /metrics port on loopback (default 0: a free "
                   "one each, printed; -1: none)")
    p.add_argument("--cluster-secret-file", default=None,
                   help="the cluster credential to use (default: a new one, removed at exit)")
    p.add_argument("--insecure", action="store_true",
                   help="no credential: any local user can act on the cluster's ports")
    add_api_key_args(p)
    add_admin_key_arg(p)
    add_passthrough_args(p)
    p.add_argument("--prefill-arg", action="append", default=[], metavar="FLAG",
                   help="extra flag for prefill workers only, after --worker-arg (repeat)")
    p.add_argument("--decode-arg", action="append", default=[], metavar="FLAG",
                   help="extra flag for decode workers only, after --worker-arg (repeat)")
    p.passthrough("--prefill-arg", "--decode-arg")
    add_observability_args(p)
    add_launcher_engine_args(p)
    add_router_output_args(p)
    return p


def served_name(args: argparse.Namespace) -> str:
    """The model id clients send (and every process's metrics carry as ``model_name``):
    ``--model-name``, else the alias or the checkpoint's name (tandem.common.model_spec's rule)."""
    return str(args.model_name or default_served_name(args.model))


def worker_argv(args: argparse.Namespace, model: str, threads: int) -> list[str]:
    """Flags every worker gets (the caller adds the role's ports and, last, its role's
    ``--prefill-arg``/``--decode-arg``): the model, threads, the served name and metrics port,
    the engine, logging, tracing and metric-name flags given, then ``--worker-arg``s (after
    those, so they win)."""
    return ["--model", model, "--threads", str(threads), "--served-model-name",
            served_name(args), "--metrics-port", str(args.worker_metrics_port),
            *worker_engine_argv(args), *observability_argv(args), *args.worker_arg]


def router_argv(args: argparse.Namespace, model: str) -> list[str]:
    """The router's flags but its workers, ports and keys: the model as the workers get it
    (the router reads its tokenizer), the served name, the engine flags it shares with the
    workers, the logging, tracing and metric-name flags, then ``--router-arg``s."""
    return ["--model", model, "--model-name", served_name(args), *router_engine_argv(args),
            *observability_argv(args), *args.router_arg]


def absolute_adapters(args: argparse.Namespace) -> None:
    """``--lora-modules`` with each adapter directory made absolute against this process's
    folder, where the user named it (the started processes run in another: ``Cluster``)."""
    modules = args.engine_lora_modules
    if modules:
        args.engine_lora_modules = [(name, os.path.abspath(os.path.expanduser(path)))
                                    for name, path in modules]


def thread_split(cores: int) -> tuple[int, int]:
    """(prefill, decode) threads for two workers sharing ``cores``.

    Prefill is compute-bound and bursty, decode memory-bound and steady: the prefill worker
    gets every core (its bursts then run at the machine's full speed) and the decode worker a
    quarter of them, which it shares. Measured on 2 cores with an fp32 SmolLM2: a
    512-token prefill chunk takes 1.18 s on 2 threads against 2.05 s on 1; serving the
    RAG/chat mix at 0.2 req/s, 2+1 threads kept 80% of requests inside the SLO where 1+1
    kept 65%, with TPOT p99 65 vs 63 ms (one 20-request point each)."""
    return max(cores, 1), max(cores // 4, 1)


def role_threads(args: argparse.Namespace, role: str, cores: int | None = None) -> int:
    """Threads of each worker of ``role`` on ``cores`` (default: this process's): the flag
    given, else one pair's :func:`thread_split`, every core for a lone decode worker, or
    the cores divided among all the workers (at least 1 each: engines that each take every
    core stall one another at every OpenMP barrier)."""
    given = args.prefill_threads if role == "prefill" else args.decode_threads
    if given is not None:
        return int(given)
    cores = max(cores if cores is not None else len(os.sched_getaffinity(0)), 1)
    prefill, decode = args.num_prefill, args.num_decode
    if (prefill, decode) == (0, 1):
        return cores
    if (prefill, decode) == (1, 1):
        return thread_split(cores)[0 if role == "prefill" else 1]
    return max(1, cores // (prefill + decode))


def lends_cores(args: argparse.Namespace) -> bool:
    """Whether the decode worker borrows the prefill worker's idle cores: one prefill and
    one decode worker (what tandem/worker/core_lending.py is built for), not turned off."""
    return ((args.num_prefill, args.num_decode) == (1, 1) and not args.no_core_share
            and not args.flippable)


def worker_names(role: str, count: int) -> list[str]:
    """Names of ``count`` workers of ``role`` in the READY line and the printed endpoints:
    the role alone for one, ``role-0``, ``role-1`` ... for several."""
    return [role] if count == 1 else [f"{role}-{i}" for i in range(count)]


# gRPC's reads on the thread that polls for its completions, not on EventEngine's pool: with
# the pool, each message a decode stream carries woke the router 6-8 times (a pool thread
# polls, another reads, the completion poller, the event loop), against 3-4 without it. On a
# host whose cores a decode step's threads fill, every wake-up takes a core from the step
# (one HTTP stream on a 2-core host running other work: TPOT median 6.5 ms without the
# pool, 8.2 ms with it, 10 runs each, interleaved; on a quieter host the two were within
# noise). A GRPC_EXPERIMENTS the user set is kept as it is.
GRPC_EXPERIMENTS = "-event_engine_client,-event_engine_listener"


def grpc_environment(environ: dict[str, str]) -> None:
    """Set the processes' gRPC runtime choice (``GRPC_EXPERIMENTS``) unless already set: gRPC
    reads it once, when it loads, so it goes to the processes through their environment."""
    environ.setdefault("GRPC_EXPERIMENTS", GRPC_EXPERIMENTS)


def main(argv: list[str] | None = None) -> int:
    """Run the local cluster until interrupted."""
    args = build_parser().parse_args(argv)
    grpc_environment(os.environ)  # inherited by every process started below
    from tandem.engine.errors import ModelLoadError
    from tandem.engine.loader import resolve_model

    try:
        _check_counts(args)
        http_port, notice = router_http_port(args.port, args.http_port)
        if notice:
            print(f"[tandem] {notice}", file=sys.stderr, flush=True)
        keys = key_file_text(args)  # checked before anything starts; never printed
        key_flags = admin_key_argv(args, bool(args.engine_allow_runtime_lora_updates))
        absolute_adapters(args)
        resolve_model(args.model)  # converts a GGUF once, before workers start
        cluster = Cluster(echo=True, credential_flags=_credential_flags(args))
    except (ModelLoadError, ValueError) as exc:
        print(f"tandem local: {exc}", file=sys.stderr)
        return 2
    # Every process gets the model as the user named it (an alias or a .gguf keeps the file's
    # own quantized blocks: tandem/engine/quant "auto"); their resolve finds the conversion done
    # above, and the router reads only its tokenizer.
    spec = str(Path(args.model).resolve()) if Path(args.model).exists() else args.model
    key_file = write_key_file(keys) if keys else None
    key_flags += ["--api-key-file", str(key_file)] if key_file else []
    if (args.num_prefill, args.num_decode) != (1, 1) and args.num_prefill and \
            not args.no_core_share:
        print("[tandem] core lending is off: it pairs one prefill with one decode worker "
              f"({args.num_prefill} prefill, {args.num_decode} decode here)", file=sys.stderr)
    share_dir = Path(tempfile.mkdtemp(prefix="tandem-local-")) if lends_cores(args) else None
    share = ["--core-share", str(make_core_share_file(share_dir))] if share_dir else []
    # SIGTERM as Ctrl-C: either one interrupts whatever this process waits for (workers
    # still loading included), then everything drains and stops; a second one kills.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        workers = _start_workers(cluster, args, spec, share)
        decode = ",".join(p.grpc for name, p in workers.items() if name.startswith("decode"))
        prefill = ",".join(p.grpc for name, p in workers.items() if name.startswith("prefill"))
        print("[tandem] starting router ...", file=sys.stderr, flush=True)
        router = cluster.start("tandem.router", "--port", str(args.port), "--decode", decode,
                               *(["--prefill", prefill] if prefill else []),
                               "--http-port", str(http_port),
                               *key_flags, *router_argv(args, spec))
        _announce(args, router, workers, key_file)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    except RuntimeError as exc:  # a process failed to start
        print(f"tandem local: {exc}", file=sys.stderr)
        return 1
    finally:
        print("\n[tandem] draining and stopping ...", file=sys.stderr, flush=True)
        _stop(cluster)
        for folder in (key_file.parent if key_file else None, share_dir):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
    return 0


def _check_counts(args: argparse.Namespace) -> None:
    if args.num_prefill < 0 or args.num_decode < 1:
        raise ValueError("--num-prefill must be 0 or more and --num-decode 1 or more")
    tensor_parallel.check_local([*worker_engine_argv(args), *args.worker_arg], args.prefill_arg,
                                args.decode_arg, args.num_prefill)


def _announce(args: argparse.Namespace, router: Any, workers: dict[str, Any],
              key_file: Path | None) -> None:
    """Print the endpoints, a command to try and the READY line."""
    example = f"{tandem_command()} generate --chat --target " + shlex.quote(router.grpc)
    if key_file is not None:  # the user's own file, else ours (it lives as long as we do)
        example += " --api-key-file " + shlex.quote(args.api_key_file or str(key_file))
    http = str(router.info.get("http", ""))
    print(f"\nTandem is serving {served_name(args)} on grpc://{router.grpc}", flush=True)
    if http:
        print(f"OpenAI-compatible API: http://{http}/v1  (ready when http://{http}/health "
              "answers 200)", flush=True)
    metrics = metrics_endpoints(http, workers)
    if metrics:
        print("Prometheus /metrics: " + ", ".join(
            f"{role} http://{address}/metrics" for role, address in metrics.items()),
            flush=True)
    print(f"Try it:  {example} \"Write a haiku about the sea\"", flush=True)
    print("Ctrl-C drains and stops the cluster.", flush=True)
    info = {"role": "local", "grpc": router.grpc, **({"http": http} if http else {}),
            "metrics": metrics, "workers": {name: p.grpc for name, p in workers.items()}}
    print(ready_line(info), end="", flush=True)


def _stop(cluster: Cluster) -> None:
    """Drain and stop every process; a second Ctrl-C or SIGTERM kills them at once."""
    try:
        cluster.stop()
    except KeyboardInterrupt:
        print("[tandem] stopping at once, without waiting for the drain", file=sys.stderr,
              flush=True)
        for proc in cluster.procs:
            proc.kill()
        cluster.stop()


def worker_commands(flippable: bool) -> dict[str, tuple[str, ...]]:
    """Each role's worker command (module and ports): a role's own worker, or (``flippable``)
    the runtime that serves either, starting with that role."""
    if flippable:
        return {role: ("tandem.worker.dual", "--role", role, "--port", "0", "--kv-port", "0")
                for role in ("decode", "prefill")}
    return {"decode": ("tandem.worker.decode", "--port", "0", "--kv-port", "0"),
            "prefill": ("tandem.worker.prefill", "--port", "0")}


def _start_workers(cluster: Cluster, args: argparse.Namespace, spec: str,
                   share: list[str]) -> dict[str, Any]:
    """Start every decode and prefill worker side by side (their imports and model loads
    overlap) on free ports, each given the ``share`` flags (the core-share file,
    tandem/worker/core_lending.py) and its role's ``--prefill-arg``/``--decode-arg`` last;
    name -> Proc (:func:`worker_names`) once all serve. RuntimeError when one fails
    (``Cluster.wait_ready`` has stopped everything then)."""
    roles = worker_commands(args.flippable)
    counts = {"decode": args.num_decode, "prefill": args.num_prefill}
    extra = {"decode": args.decode_arg, "prefill": args.prefill_arg}
    print(f"[tandem] starting {args.num_decode} decode and {args.num_prefill} prefill "
          "workers ...", file=sys.stderr, flush=True)
    spawned = {
        name: cluster.spawn(*roles[role], *share,
                            *worker_argv(args, spec, role_threads(args, role)), *extra[role])
        for role in ("decode", "prefill") for name in worker_names(role, counts[role])
    }
    return {name: cluster.wait_ready(proc) for name, proc in spawned.items()}


def metrics_endpoints(router_http: str, workers: dict[str, Any]) -> dict[str, str]:
    """Where each process serves /metrics (name -> host:port): the router on its HTTP port,
    each worker (by its :func:`worker_names` name) on its metrics port (none when it serves
    none)."""
    out = {"router": router_http} if router_http else {}
    out.update({name: str(p.info["metrics"]) for name, p in workers.items()
                if p.info.get("metrics")})
    return out


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




if __name__ == "__main__":
    raise SystemExit(main())
