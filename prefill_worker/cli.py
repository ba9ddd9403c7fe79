"""``python -m prefill_worker --port P [--router HOST:PORT] [engine flags]``
(and ``tandem prefill``)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from decode_worker.tls import add_tls_args
from engine.cli_args import add_engine_args


def build_parser() -> argparse.ArgumentParser:
    """The prefill worker's flags: where to listen, the router, KV transfer, the engine."""
    p = argparse.ArgumentParser(prog="prefill_worker", description="Tandem prefill worker")
    p.add_argument("--host", default="127.0.0.1", help="gRPC listen address")
    p.add_argument("--port", type=int, required=True, help="gRPC port (0: pick a free one)")
    p.add_argument("--no-kv-shm", action="store_true", help="push over TCP even on one host")
    p.add_argument("--kv-secret-file", default=None, help="shared KV secret (>= 16 bytes)")
    p.add_argument("--transfer-timeout-s", type=float, default=30.0)
    p.add_argument("--router", default=None, help="router HOST:PORT to register with")
    p.add_argument("--worker-id", default=None)
    p.add_argument("--drain-timeout-s", type=float, default=60.0)
    p.add_argument("--metrics-port", type=int, default=-1,
                   help="serve Prometheus /metrics here (-1: off, 0: pick a free port)")
    p.add_argument("--metrics-host", default=None, help="metrics listen address (default: --host)")
    add_tls_args(p)
    add_engine_args(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run a prefill worker until SIGTERM; returns the exit status (2: bad flags/busy port)."""
    from decode_worker.cli import run_worker
    from prefill_worker.app import build_prefill_app

    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not 0 <= args.port < 65536:
        parser.error("--port must be in 0..65535")
    if not args.transfer_timeout_s > 0:
        parser.error("--transfer-timeout-s must be > 0")
    return run_worker("prefill_worker", parser, args, build_prefill_app)
