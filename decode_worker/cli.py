"""``python -m decode_worker --port P --kv-port Q [engine flags]`` (and ``tandem decode``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from decode_worker.tls import add_tls_args, router_credentials_from_args, server_tls_from_args
from engine.cli_args import add_engine_args, engine_config_from_args


def build_parser() -> argparse.ArgumentParser:
    """The decode worker's flags: where to listen, the router, KV transfer, the engine."""
    p = argparse.ArgumentParser(prog="decode_worker", description="Tandem decode worker")
    p.add_argument("--host", default="127.0.0.1", help="gRPC (and KV) listen address")
    p.add_argument("--port", type=int, required=True, help="gRPC port (0: pick a free one)")
    p.add_argument("--kv-port", type=int, required=True, help="KV receiver TCP port (0: free)")
    p.add_argument("--kv-host", default=None, help="KV listen address (default: --host)")
    p.add_argument("--no-kv-shm", action="store_true", help="TCP only, no shared memory")
    p.add_argument("--kv-secret-file", default=None, help="shared KV secret (>= 16 bytes)")
    p.add_argument("--router", default=None, help="router HOST:PORT to register with")
    p.add_argument("--worker-id", default=None)
    p.add_argument("--default-lease-s", type=float, default=30.0)
    p.add_argument("--drain-timeout-s", type=float, default=60.0)
    p.add_argument("--metrics-port", type=int, default=-1,
                   help="serve Prometheus /metrics here (-1: off, 0: pick a free port)")
    p.add_argument("--metrics-host", default=None, help="metrics listen address (default: --host)")
    add_tls_args(p)
    add_engine_args(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run a decode worker until SIGTERM; returns the exit status (2: bad flags/busy port)."""
    from decode_worker.app import build_decode_app

    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("port", "kv_port"):
        if not 0 <= getattr(args, name) < 65536:
            parser.error(f"--{name.replace('_', '-')} must be in 0..65535")
    return run_worker("decode_worker", parser, args, build_decode_app)


def run_worker(
    prog: str,
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    build_app: Callable[[argparse.Namespace, Any, bytes], Any],
) -> int:
    """The start-up both worker roles share: engine config, KV secret, TLS, router
    credentials and metrics port from the flags, then serve ``build_app`` until SIGTERM.
    Returns the exit status (2: bad flags/files or a busy port)."""
    from decode_worker.process import ServeConfig, StartupError, load_kv_secret, serve

    try:
        engine_config = engine_config_from_args(args)
        secret = load_kv_secret(args.kv_secret_file)
        tls = server_tls_from_args(args)
        router_credentials = router_credentials_from_args(args)
    except (StartupError, ValueError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    if not -1 <= args.metrics_port < 65536:
        parser.error("--metrics-port must be in -1..65535")
    config = ServeConfig(host=args.host, port=args.port, router=args.router,
                         drain_timeout_s=args.drain_timeout_s, metrics_port=args.metrics_port,
                         metrics_host=args.metrics_host, tls=tls,
                         router_credentials=router_credentials)
    try:
        return asyncio.run(serve(config, lambda: build_app(args, engine_config, secret)))
    except StartupError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
