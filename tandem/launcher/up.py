"""``tandem up``: a whole Tandem cluster on Ray (a new local instance, or ``--address``).

    tandem up [--model smollm2] [--num-prefill 1] [--num-decode 1] [--port 50051]
              [--http-port 8000] [--address ADDR] [--prefill-gpus G] [--decode-gpus G]
              [--cpus-per-worker C] [--resources JSON] [--autoscale FILE.yaml] [--detach]
              [--threads T] [--served-model-name NAME] [--api-key KEY | --api-key-file FILE]
              [--worker-arg F] [--prefill-arg F] [--decode-arg F] [--router-arg F] ...

Starts the router, prefill and decode workers as Ray actors (the same servers as the
standalone commands, in-process), waits until every worker serves and is registered, prints
the gRPC and HTTP endpoints and a command to try. Without ``--detach`` it stays in the
foreground and Ctrl-C (or SIGTERM) drains and stops everything, the start too when it comes
first; with ``--detach`` the actors are detached. ``tandem down`` with no arguments, on this
machine, stops either (it reads a state file this command leaves: tandem/launcher/up_state.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from tandem.autoscaler.config import AutoscaleConfig, AutoscaleConfigError, load_config
from tandem.cli.invocation import tandem_command
from tandem.common.arg_parser import ArgParser
from tandem.common.model_spec import served_name
from tandem.common.router_ports import router_http_port
from tandem.common.security.credential import ClusterCredential, new_secret
from tandem.common.security.grpc_auth import is_loopback
from tandem.common.wire import ready_line
from tandem.launcher import tensor_parallel, up_state
from tandem.launcher.api_keys import add_api_key_args, check_admin_flags, key_file_text
from tandem.launcher.engine_flags import (
    add_launcher_engine_args,
    add_observability_args,
    add_passthrough_args,
    add_router_output_args,
    observability_argv,
    router_engine_argv,
    worker_engine_argv,
)
from tandem.launcher.spec import NAMESPACE, REGISTRY, LaunchSpec
from tandem.worker.core_lending import make_core_share_file


def build_parser() -> argparse.ArgumentParser:
    """Flags of ``tandem up``."""
    p = ArgParser(prog="tandem up", description=__doc__, config_file=True,
                  formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="alias, HF directory or .gguf file")
    p.add_argument("--model-name", "--served-model-name", dest="model_name", default="",
                   help="served model id (default: the alias, the .gguf file's stem or the "
                   "directory's name)")
    p.add_argument("--prefill", "--num-prefill", dest="prefill", type=int, default=1,
                   help="prefill workers (0: colocated)")
    p.add_argument("--decode", "--num-decode", dest="decode", type=int, default=1,
                   help="decode workers")
    p.add_argument("--host", default="127.0.0.1",
                   help="router listen address (default loopback: a multi-node cluster or a "
                   "pod needs 0.0.0.0 or the node's address)")
    p.add_argument("--port", type=int, default=50051, help="router gRPC port (0: free)")
    p.add_argument("--http-port", type=int, default=None,
                   help="router HTTP port (default 8000; a free one when --port is 0 or "
                   "8000 itself; 0: free)")
    g = p.add_argument_group("ray")
    g.add_argument("--address", default=None,
                   help="existing Ray cluster ('auto', HOST:PORT); default: start a local one")
    g.add_argument("--namespace", default=NAMESPACE, help="Ray namespace of everything started")
    g.add_argument("--num-cpus", type=int, default=None, help="local Ray instance: CPUs")
    g.add_argument("--num-gpus", type=int, default=None, help="local Ray instance: GPUs")
    g.add_argument("--detach", action="store_true",
                   help="start detached actors and return (stop with tandem down)")
    g.add_argument("--max-restarts", type=int, default=3, help="restarts per actor (-1: always)")
    g.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait")
    g = p.add_argument_group("placement and resources")
    g.add_argument("--prefill-gpus", type=float, default=0.0,
                   help="GPUs per prefill worker (a worker of --tensor-parallel-size N: N, "
                   "one per rank, or 0)")
    g.add_argument("--decode-gpus", type=float, default=0.0,
                   help="GPUs per decode worker (as --prefill-gpus)")
    g.add_argument("--cpus-per-worker", type=float, default=1.0,
                   help="Ray CPUs per worker, per rank of a tensor-parallel one")
    g.add_argument("--router-cpus", type=float, default=0.0, help="CPUs for the router")
    g.add_argument("--resources", default="{}",
                   help='custom Ray resources per worker, JSON: \'{"accel": 1}\'')
    g.add_argument("--no-pack", action="store_true",
                   help="do not pack a prefill and a decode worker per node")
    g = p.add_argument_group("cluster credential (default: a new one for this cluster)")
    g.add_argument("--cluster-secret-file", default=None,
                   help="use this credential (0600 file) instead of generating one")
    g.add_argument("--insecure", action="store_true",
                   help="no credential: anyone who reaches the internal ports can act on the "
                   "cluster (with --address: also join a Ray cluster without token auth)")
    add_api_key_args(p, p.add_argument_group(
        "router API keys (a public --host needs some, or --router-arg=--allow-unauthenticated)"))
    g = p.add_argument_group("workers")
    g.add_argument("--threads", type=int, default=None,
                   help="CPU threads per worker engine (default on a local instance: one "
                        "prefill and one decode worker as tandem local lays them out, the "
                        "decode worker borrowing the prefill worker's idle cores; more "
                        "workers: the machine's cores divided among them, at least 1 each, "
                        "no cores lent; on a cluster: torch's)")
    g.add_argument("--worker-metrics-port", type=int, default=0,
                   help="each worker's Prometheus /metrics port, on its listen address "
                   "(default 0: a free one, shown by tandem status; -1: none; a fixed port "
                   "needs one worker per node)")
    add_passthrough_args(p, g)
    g.add_argument("--prefill-arg", action="append", default=[], metavar="FLAG",
                   help="extra flag for prefill workers only, after --worker-arg (repeat)")
    g.add_argument("--decode-arg", action="append", default=[], metavar="FLAG",
                   help="extra flag for decode workers only, after --worker-arg (repeat)")
    p.passthrough("--prefill-arg", "--decode-arg")
    add_observability_args(p)
    add_launcher_engine_args(p)
    add_router_output_args(p)
    g = p.add_argument_group("autoscaling")
    g.add_argument("--autoscale", default=None, metavar="FILE.yaml",
                   help="autoscale policy file (deploy/autoscale/{slo,queue,fixed}.yaml)")
    g.add_argument("--signal-window", type=float, default=None,
                   help="workers' latency window in s (default: the policy's window_s)")
    return p


def spec_from_args(args: argparse.Namespace, autoscale: AutoscaleConfig | None) -> LaunchSpec:
    """Flags -> LaunchSpec (ValueError with a clear message on bad values)."""
    try:
        resources = json.loads(args.resources)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--resources is not JSON: {exc}") from exc
    if not isinstance(resources, dict) or not all(
        isinstance(v, int | float) for v in resources.values()
    ):
        raise ValueError('--resources must be a JSON object of numbers, e.g. {"accel": 1}')
    window = args.signal_window or (autoscale.window_s if autoscale else 10.0)
    prefill_workers = max(args.prefill, autoscale.prefill.max if autoscale else 0)
    prefill_ranks, decode_ranks = tensor_parallel.role_sizes(
        [*worker_engine_argv(args), *args.worker_arg], args.prefill_arg, args.decode_arg,
        prefill_workers, cuda=args.prefill_gpus > 0 and args.decode_gpus > 0)
    return LaunchSpec(
        model=args.model, model_name=args.model_name, prefill=args.prefill,
        decode=args.decode, host=args.host, port=args.port,
        http_port=_http_port(args),
        prefill_gpus=args.prefill_gpus, decode_gpus=args.decode_gpus,
        prefill_ranks=prefill_ranks, decode_ranks=decode_ranks,
        cpus_per_worker=args.cpus_per_worker, router_cpus=args.router_cpus,
        resources=tuple(sorted((str(k), float(v)) for k, v in resources.items())),
        threads=args.threads,
        # Engine, logging and tracing flags first, the escape hatches last: a --worker-arg
        # given wins (and a role's own --prefill-arg / --decode-arg after it).
        worker_args=(*worker_engine_argv(args), *observability_argv(args), *args.worker_arg),
        router_args=(*router_engine_argv(args), *observability_argv(args), *args.router_arg),
        prefill_args=tuple(args.prefill_arg), decode_args=tuple(args.decode_arg),
        namespace=args.namespace, detach=args.detach,
        max_restarts=args.max_restarts, pack_pairs=not args.no_pack,
        signal_window_s=window, ready_timeout_s=args.ready_timeout, autoscale=autoscale,
        cluster_secret=_cluster_secret(args), insecure=args.insecure,
        api_keys=key_file_text(args),
        # A local instance lives on this machine only: its workers listen on loopback.
        worker_host="127.0.0.1" if args.address is None else "",
        worker_metrics_port=args.worker_metrics_port,
    )


def _http_port(args: argparse.Namespace) -> int:
    """The router's HTTP port (tandem/common/router_ports.py's rule; its notice on stderr)."""
    port, notice = router_http_port(args.port, args.http_port)
    if notice:
        print(f"[tandem] {notice}", file=sys.stderr, flush=True)
    return port


def _check_public_bind(spec: LaunchSpec) -> None:
    """Refuse, before anything starts, a router the router itself would refuse: a public API
    on a non-loopback address without API keys, unless allowed (``--router-arg=...``)."""
    flags = {a.split("=", 1)[0] for a in spec.router_args}
    if spec.api_keys or flags & {"--api-key-file", "--api-key", "--allow-unauthenticated"}:
        return
    if not is_loopback(spec.host):  # the router's own test ([::1] too)
        raise ValueError(f"--host {spec.host} without API keys: pass --api-key-file FILE "
                         "(or --api-key), or --router-arg=--allow-unauthenticated if that "
                         "network is trusted")


def _cluster_secret(args: argparse.Namespace) -> str:
    """The cluster's secret as hex: read from ``--cluster-secret-file``, none with
    ``--insecure``, else a new one (it lives as long as this cluster's actors)."""
    if args.insecure:
        if args.cluster_secret_file:
            raise ValueError("--cluster-secret-file and --insecure exclude each other")
        print("[tandem] --insecure: the cluster runs without a credential; anyone who can "
              "reach its internal ports can act on it", file=sys.stderr, flush=True)
        return ""
    if args.cluster_secret_file:
        ClusterCredential.from_file(args.cluster_secret_file)  # the same checks as a worker's
        return Path(args.cluster_secret_file).read_text().strip()
    return new_secret()


def main(argv: list[str] | None = None) -> int:
    """Start the cluster; in the foreground, serve until interrupted, then drain and stop."""
    args = build_parser().parse_args(argv)
    try:
        autoscale = load_config(args.autoscale) if args.autoscale else None
        spec = spec_from_args(args, autoscale)
        _check_public_bind(spec)
        check_admin_flags(spec.router_args)
        if args.address is not None and spec.host in ("127.0.0.1", "localhost", "::1"):
            print("[tandem] the router listens on loopback: workers on other nodes cannot "
                  "register (pass --host 0.0.0.0 or this node's address)", file=sys.stderr)
        if spec.detach and args.address is None:
            raise ValueError("--detach needs --address: a local Ray instance ends with "
                             "this command")
    except (AutoscaleConfigError, ValueError) as exc:
        print(f"tandem up: {exc}", file=sys.stderr)
        return 2
    try:
        _resolve(spec.model)
    except ValueError as exc:
        print(f"tandem up: {exc}", file=sys.stderr)
        return 2
    # A local instance shares this machine's files; on a cluster each node resolves the
    # model itself (a path must then exist on every node, an alias is converted per node).
    # Every process gets the model as named (an alias or a .gguf keeps the file's own
    # quantized blocks: tandem/engine/quant "auto"; the router reads only its tokenizer), a path
    # made absolute; their resolve finds the conversion done above.
    model = str(Path(spec.model).resolve()) if Path(spec.model).exists() else spec.model
    share_dir: Path | None = None
    if args.address is None and spec.threads is None and _one_local_pair(spec):
        share_dir = Path(tempfile.mkdtemp(prefix="tandem-up-"))
        spec = lend_cores(spec, make_core_share_file(share_dir), len(os.sched_getaffinity(0)))
    elif args.address is None and spec.threads is None:
        spec = share_threads(spec, os.cpu_count() or 1)
    try:
        return _serve(args, spec, model)
    finally:
        if share_dir is not None:
            shutil.rmtree(share_dir, ignore_errors=True)


def _serve(args: argparse.Namespace, spec: LaunchSpec, model: str) -> int:
    """Start the pool on Ray and, in the foreground, serve until interrupted or stopped.

    Ctrl-C and SIGTERM alike interrupt whatever this process waits for, the start included
    (a worker still loading its model is not waited for), then everything started drains and
    stops: with nothing in flight that takes seconds. A second one stops without waiting for
    the drain. The state file (tandem/launcher/up_state.py) lets ``tandem down`` find this
    cluster; it goes when this process ends (a detached cluster's stays for ``down``)."""
    import ray

    from tandem.launcher.connect import check_ray_auth, connect, find_pool
    from tandem.launcher.placement import home_strategy
    from tandem.launcher.pool import PoolActor

    busy = _running_here(spec.namespace)
    if busy is not None:
        print(f"tandem up: {busy}", file=sys.stderr)
        return 1
    pool, detached = None, False
    try:
        context = connect(args.address, spec.namespace, _local_cpus(args, spec), args.num_gpus)
        # After ray.init, which sets a SIGTERM handler of its own (exit at once).
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        if args.address is not None:  # a cluster started elsewhere: only one with token auth
            try:
                check_ray_auth(spec.insecure)
            except (ValueError, RuntimeError) as exc:
                print(f"tandem up: {exc}", file=sys.stderr)
                ray.shutdown()  # leave the cluster as found
                return 2
        home = ray.get_runtime_context().get_node_id()
        if find_pool(spec.namespace) is not None:
            print(f"tandem up: a cluster already runs in Ray namespace {spec.namespace!r} "
                  "(tandem status / tandem down)", file=sys.stderr)
            return 1
        _record(up_state.UpState.of_this_process(
            spec.namespace, str(context.address_info["gcs_address"]), args.address is None))
        pool = ray.remote(PoolActor).options(
            name=REGISTRY, namespace=spec.namespace, num_cpus=0, max_concurrency=256,
            lifetime="detached" if spec.detach else None,
            scheduling_strategy=home_strategy(home),
        ).remote(spec.without_secrets(), model, home)  # no secret in the GCS: start() takes them
        print(f"[tandem] starting router, {spec.prefill} prefill and {spec.decode} decode "
              "workers on Ray ...", file=sys.stderr, flush=True)
        status = ray.get(pool.start.remote(spec.cluster_secret, spec.api_keys))
        _announce(spec, status, args.api_key_file)
        if spec.detach:
            detached = True
            return 0
        while find_pool(spec.namespace) is not None:  # until `tandem down` in another shell
            time.sleep(1.0)
        print("[tandem] stopped by tandem down", file=sys.stderr, flush=True)
        return 0
    except KeyboardInterrupt:
        print("\n[tandem] draining and stopping ...", file=sys.stderr, flush=True)
        _stop(pool, spec.namespace)
        return 0
    except Exception as exc:  # a worker could not start: say why, stop what did
        print(f"tandem up: {exc}", file=sys.stderr)
        _stop(pool, spec.namespace)
        return 1
    finally:
        if not detached:  # a detached cluster's state stays for tandem down
            up_state.remove(spec.namespace, os.getpid())


def _running_here(namespace: str) -> str | None:
    """Why not to start: another ``tandem up`` of ``namespace`` runs on this machine (its
    state file names a live process); None when none does."""
    try:
        existing = up_state.read(namespace)
    except up_state.UpStateError as exc:
        print(f"[tandem] ignoring {exc}", file=sys.stderr)
        return None
    if existing is None or existing.pid == os.getpid() or not existing.alive():
        return None
    return (f"tandem up (pid {existing.pid}) already runs namespace {namespace!r} on this "
            "machine: tandem down first, or pass another --namespace")


def _record(state: up_state.UpState) -> None:
    """Write the state file ``tandem down`` reads; a cluster still starts without one (the
    reason is printed: ``tandem down --address`` then finds it)."""
    try:
        up_state.write(state)
    except OSError as exc:
        print(f"[tandem] no state file for tandem down ({exc}): stop it with "
              f"tandem down --address {state.address}", file=sys.stderr)


def _stop(pool: object, namespace: str) -> None:
    """Drain and stop through ``pool`` (when it was made); a second Ctrl-C or SIGTERM
    stops every actor at once instead."""
    from tandem.launcher.down import stop_pool, sweep

    if pool is None:
        return
    try:
        stop_pool(pool, namespace)
    except KeyboardInterrupt:
        print("[tandem] stopping at once, without waiting for the drain", file=sys.stderr,
              flush=True)
        sweep(namespace)


def _one_local_pair(spec: LaunchSpec) -> bool:
    """One prefill and one decode worker, no autoscaling, no GPUs, one rank each: ``make
    serve``'s cluster, laid out as ``tandem local`` lays out its two workers
    (:func:`lend_cores`). Not for tensor-parallel workers: the core share resizes one
    process's thread pool, and a group's other ranks keep theirs."""
    return (spec.prefill == 1 and spec.decode == 1 and spec.autoscale is None
            and not spec.prefill_gpus and not spec.decode_gpus
            and spec.prefill_ranks == spec.decode_ranks == 1)


def lend_cores(spec: LaunchSpec, share: Path, cores: int) -> LaunchSpec:
    """``spec`` with ``tandem local``'s layout of one prefill and one decode worker on
    ``cores``: the prefill worker every core, the decode worker a quarter, borrowing the
    prefill worker's while it is idle through the core-share file ``share``
    (tandem/worker/core_lending.py). The user's ``--prefill-arg``/``--decode-arg`` come after, so a
    ``--threads`` given there wins."""
    from tandem.launcher.local import thread_split

    prefill, decode = thread_split(cores)
    flags = ("--core-share", str(share))
    return dataclasses.replace(
        spec, prefill_args=("--threads", str(prefill), *flags, *spec.prefill_args),
        decode_args=("--threads", str(decode), *flags, *spec.decode_args))


def share_threads(spec: LaunchSpec, cores: int) -> LaunchSpec:
    """``spec`` with engine threads for a local instance: this machine's ``cores`` shared
    out among the rank processes it may run (a worker's ``--threads`` is its ranks' total,
    tandem/engine/parallel/collectives.rank_threads splits it), at least 1 a rank. Engines
    that all take every core stall each other at every OpenMP barrier: two int4 decode
    loops with 2 threads each on 2 cores ran at a 113 ms p90 step against 17 ms with 1 thread
    each (9 ms alone). A role's own ``--threads`` (``--prefill-arg``) still wins, and a
    ``--worker-arg=--threads`` leaves every worker to it."""
    if any(a == "--threads" or a.startswith("--threads=") for a in spec.worker_args):
        return spec
    per_rank = max(1, cores // max(1, _local_ranks(spec)))
    if spec.prefill_ranks == spec.decode_ranks == 1:
        return dataclasses.replace(spec, threads=per_rank)
    return dataclasses.replace(
        spec, prefill_args=("--threads", str(per_rank * spec.prefill_ranks), *spec.prefill_args),
        decode_args=("--threads", str(per_rank * spec.decode_ranks), *spec.decode_args))


def _local_ranks(spec: LaunchSpec) -> int:
    """Rank processes of every worker the cluster may run (the autoscaler's maxima)."""
    auto = spec.autoscale
    prefill, decode = (auto.prefill.max, auto.decode.max) if auto else (spec.prefill,
                                                                         spec.decode)
    return prefill * spec.prefill_ranks + decode * spec.decode_ranks


def _local_cpus(args: argparse.Namespace, spec: LaunchSpec) -> int | None:
    """CPUs of a new local instance: enough logical CPUs for every worker it may run, each
    rank of a tensor-parallel one ``--cpus-per-worker`` (Ray's CPUs are scheduling tokens; the
    engines' threads are set by --threads)."""
    if args.address is not None or args.num_cpus is not None:
        return args.num_cpus
    need = math.ceil(_local_ranks(spec) * spec.cpus_per_worker + spec.router_cpus)
    return max(os.cpu_count() or 1, need)


def _resolve(model: str) -> None:
    """Check ``model`` and convert an alias or GGUF once, up front (ValueError if it is none
    of alias, .gguf file or checkpoint directory)."""
    if Path(model).is_dir():
        return  # nothing to convert: skip importing the engine
    from tandem.engine.errors import ModelLoadError
    from tandem.engine.loader import resolve_model

    try:
        resolve_model(model)
    except ModelLoadError as exc:
        raise ValueError(str(exc)) from exc


def _announce(spec: LaunchSpec, status: dict[str, object], api_key_file: str = "") -> None:
    router = status["router"]
    assert isinstance(router, dict)
    grpc_ep, http_ep = router["grpc"], router.get("http")
    example = f"{tandem_command()} generate --chat --target {shlex.quote(grpc_ep)}"
    if spec.api_keys:  # never the key itself: the user's file, else a placeholder
        example += (f" --api-key-file {shlex.quote(api_key_file)}" if api_key_file
                    else " --api-key KEY")
    example += " \"Write a haiku about the sea\""
    name = spec.model_name or served_name(spec.model)
    print(f"\nTandem is serving {name} on Ray (namespace {spec.namespace})", flush=True)
    print(f"  gRPC:  {grpc_ep}", flush=True)
    if http_ep:
        print(f"  HTTP:  http://{http_ep}/v1", flush=True)
    print(f"  workers: {status['replicas']}  (tandem status --namespace {spec.namespace})")
    print(f"Try it:  {example}", flush=True)
    if spec.api_keys and not api_key_file:
        print("         (KEY: one of the --api-key values given)", flush=True)
    print("Stop:    " + ("tandem down" if spec.detach else "Ctrl-C drains and stops it"),
          flush=True)
    info = {"role": "up", "grpc": grpc_ep, "http": http_ep, "namespace": spec.namespace}
    print(ready_line(info), end="", flush=True)
