"""The command-line start-up both roles share: common flags, their config, ``run_worker``.

    role parser = role flags + add_worker_args(...)      (host, port, router, the cluster
                                                          credential, TLS, metrics, drain,
                                                          logging, tracing, engine flags)
    args ──role config_from_args──> RoleAppConfig(worker=worker_config(args), ...)
         ──run_worker──> serve(config.worker.serve, build_app(config)) until SIGTERM

A bad flag or file is exit status 2 with one line on stderr, as argparse does. There is no
built-in secret: a worker needs ``--cluster-secret-file`` (``tandem local``/``tandem up`` make
one per cluster) or an explicit ``--insecure``, which it warns about at every start.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from tandem.common.obs.log_format import add_log_args, setup_logging
from tandem.common.obs.metrics_export import add_metrics_compat_arg
from tandem.common.obs.tracing_setup import (
    add_tracing_args,
    setup_tracing,
    tracing_config_from_args,
)
from tandem.common.security.credential import (
    ClusterCredential,
    CredentialError,
    add_credential_args,
    credential_from_flags,
)
from tandem.engine.cli_args import add_engine_args, engine_config_from_args
from tandem.kv_transfer import ConfigError
from tandem.kv_transfer.codecs import NAMES as KV_CODECS
from tandem.kv_transfer.codecs import codec as kv_codec
from tandem.worker.app import WorkerApp
from tandem.worker.config import ServeConfig, StartupError, WorkerConfig
from tandem.worker.process import serve
from tandem.worker.tls import (
    add_tls_args,
    kv_tls_from_args,
    router_credentials_from_args,
    server_tls_from_args,
)

log = logging.getLogger(__name__)


def checked_codec(name: str) -> str:
    """``--kv-codec``'s value, once its package is known to be installed (ValueError says
    what to install)."""
    try:
        kv_codec(name)
    except ConfigError as exc:
        raise ValueError(f"--kv-codec: {exc}") from exc
    return name


def checked_stripes(n: int | None) -> int | None:
    """``--kv-stripes``: None (the role's default) or at least 1."""
    if n is not None and n < 1:
        raise ValueError("--kv-stripes must be >= 1")
    return n

class RoleAppConfig(Protocol):
    """A role's frozen config: the shared part plus the role's own fields."""

    @property
    def worker(self) -> WorkerConfig: ...


C = TypeVar("C", bound=RoleAppConfig)


def add_worker_args(p: argparse.ArgumentParser, *, host_help: str, shm_help: str) -> None:
    """The flags every worker role takes (the role adds its own before or after)."""
    p.add_argument("--host", default="127.0.0.1", help=host_help)
    p.add_argument("--port", type=int, required=True, help="gRPC port (0: pick a free one)")
    p.add_argument("--no-kv-shm", action="store_true", help=shm_help)
    p.add_argument("--advertise-address", action="append", default=[], metavar="HOST:PORT",
                   help="another address callers dial this worker's gRPC port by (a proxy, a "
                   "Kubernetes Service, NAT); cluster tokens minted for it are accepted too "
                   "(repeatable; its own bound address always is)")
    p.add_argument("--kv-codec", choices=KV_CODECS, default="raw",
                   help="KV payload codec over TCP, set alike on both roles (the prefill worker "
                   "asks for it, the decode worker accepts it): raw; zstd (lossless, needs "
                   "tandem-serve[kv-compress]); int8 (lossy, about half the bytes of a 16-bit "
                   "cache; docs/kv_transfer.md has its measured quality)")
    p.add_argument("--kv-stripes", type=int, default=None, metavar="N",
                   help="TCP connections one KV transfer is striped over, for links one "
                   "connection cannot fill: the prefill worker stripes over N (default 1), the "
                   "decode worker accepts up to N (default 4)")
    add_credential_args(p, "every RPC but health, registration and the KV port")
    p.add_argument("--router", default=None, help="router HOST:PORT to register with")
    p.add_argument("--worker-id", default=None)
    p.add_argument("--drain-timeout-s", type=float, default=60.0,
                   help="on SIGTERM (or a scale-down), seconds running work may take to finish")
    p.add_argument("--stop-grace-s", type=float, default=5.0,
                   help="then, seconds calls still open get before they are cut (a decode "
                   "stream cut this way migrates to another decode worker)")
    p.add_argument("--metrics-port", type=int, default=-1,
                   help="serve Prometheus /metrics here (-1: off, 0: pick a free port)")
    p.add_argument("--metrics-host", default=None, help="metrics listen address (default: --host)")
    p.add_argument("--served-model-name", "--model-name", dest="served_model_name", default="",
                   help="the model id clients use (the router's --model-name), as /metrics' "
                   "model_name label (default: the last part of --model)")
    p.add_argument("--core-share", default=None, metavar="FILE",
                   help="a core-share file this host's prefill and decode workers both name "
                   "(tandem local makes one): the prefill worker lends its cores while idle, "
                   "the decode worker may run a step on every core then, under a lease the "
                   "prefill worker revokes before it computes")
    p.add_argument("--step-threads", choices=("adaptive", "fixed"), default="adaptive",
                   help="decode worker: each step on half or all of its threads (with "
                   "--core-share: its own or every core), whichever measures faster for "
                   "steps of that size (default); fixed: every step on --threads, or with "
                   "--core-share on every core whenever the prefill worker is idle")
    p.add_argument("--step-log", default=None, metavar="FILE",
                   help="append a line per model step to FILE (wall-clock start, seconds, "
                   "decode rows, prompt tokens; tandem/worker/step_log.py): for measuring step costs "
                   "under serving (default: off)")
    p.add_argument("--skip-warmup", action="store_true",
                   help="serve without the start-up warm-up (a few synthetic steps that pay "
                   "first-call costs and give the router's placement a step-cost fit before "
                   "the first request; tandem/engine/warmup.py)")
    add_metrics_compat_arg(p)
    add_tls_args(p)
    add_log_args(p)
    add_tracing_args(p)
    add_engine_args(p)


def check_ports(parser: argparse.ArgumentParser, args: argparse.Namespace, *names: str) -> None:
    """``parser.error`` (exit 2) unless each named port flag is in 0..65535 and
    ``--metrics-port`` in -1..65535."""
    for name in names:
        if not 0 <= getattr(args, name) < 65536:
            parser.error(f"--{name.replace('_', '-')} must be in 0..65535")
    if not -1 <= args.metrics_port < 65536:
        parser.error("--metrics-port must be in -1..65535")


def load_credential(args: argparse.Namespace) -> ClusterCredential:
    """The credential the flags name; StartupError when there is none or it is unusable."""
    try:
        return credential_from_flags(args.cluster_secret_file, args.insecure, "worker")
    except CredentialError as exc:
        raise StartupError(str(exc)) from exc


def _advertised(addresses: list[str]) -> tuple[str, ...]:
    """``--advertise-address`` values, each checked to be HOST:PORT."""
    for address in addresses:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65_536:
            raise ValueError(f"--advertise-address {address!r}: expected HOST:PORT")
    return tuple(addresses)


def worker_config(args: argparse.Namespace, role: str) -> WorkerConfig:
    """The shared config from the shared flags of ``role`` ("prefill" | "decode"); reads the
    credential and TLS files. Raises StartupError or ValueError (a bad engine flag, an
    unreadable file)."""
    if not (args.drain_timeout_s >= 0 and args.stop_grace_s >= 0):
        raise ValueError("--drain-timeout-s and --stop-grace-s must be >= 0")
    serve_config = ServeConfig(
        credential=load_credential(args), host=args.host, port=args.port, router=args.router,
        drain_timeout_s=args.drain_timeout_s, stop_grace_s=args.stop_grace_s,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host, tls=server_tls_from_args(args),
        router_credentials=router_credentials_from_args(args),
        advertise=_advertised(args.advertise_address),
    )
    return WorkerConfig(
        serve=serve_config, engine=engine_config_from_args(args), worker_id=args.worker_id,
        kv_shm=not args.no_kv_shm, kv_tls=kv_tls_from_args(args, role),
        kv_codec=checked_codec(args.kv_codec), kv_stripes=checked_stripes(args.kv_stripes),
        served_model_name=args.served_model_name, metrics_compat=args.metrics_compat,
        core_share=args.core_share, adaptive_threads=args.step_threads == "adaptive",
        step_log=args.step_log, warmup=not args.skip_warmup,
    )


def setup_observability(args: argparse.Namespace, role: str) -> None:
    """A worker process's logging (--log-format, --log-level: on stderr, stdout carries the
    READY line) and tracing (--otlp-endpoint, --trace-file) for ``role`` ("prefill" |
    "decode"); raises TracingSetupError."""
    setup_logging(args.log_format, args.log_level, service=role)
    setup_tracing(tracing_config_from_args(args), f"tandem-{role}")


def run_worker(
    prog: str,
    args: argparse.Namespace,
    config_from_args: Callable[[argparse.Namespace], C],
    build_app: Callable[[C], Awaitable[WorkerApp]],
) -> int:
    """Build the role's config from ``args`` and serve ``build_app(config)`` until SIGTERM.
    Returns the exit status (2: bad flags/files, a busy port or a model that does not load)."""
    try:
        config = config_from_args(args)
    except (StartupError, ValueError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(serve(config.worker.serve, lambda: build_app(config)))
    except StartupError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
