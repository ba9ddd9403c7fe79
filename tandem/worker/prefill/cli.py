"""``python -m tandem.worker.prefill --port P [--router HOST:PORT] [engine flags]``
(and ``tandem prefill``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from tandem.common.arg_parser import ArgParser
from tandem.common.obs.tracing_setup import TracingSetupError
from tandem.worker.cli import (
    add_worker_args,
    check_ports,
    run_worker,
    setup_observability,
    worker_config,
)
from tandem.worker.prefill.app import PrefillAppConfig, build_prefill_app


def build_parser() -> argparse.ArgumentParser:
    """The prefill worker's flags: its push timeout, then every worker's flags."""
    p = ArgParser(prog="prefill_worker", description="Tandem prefill worker", config_file=True)
    p.add_argument("--transfer-timeout-s", type=float, default=30.0)
    add_worker_args(p, host_help="gRPC listen address",
                    shm_help="push over TCP even on one host")
    return p


def config_from_args(args: argparse.Namespace) -> PrefillAppConfig:
    """The prefill worker's config from its flags (reads the secret and TLS files)."""
    return PrefillAppConfig(worker=worker_config(args, "prefill"),
                            transfer_timeout_s=args.transfer_timeout_s)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a prefill worker until SIGTERM; returns the exit status (2: bad flags/busy port)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        setup_observability(args, "prefill")
    except TracingSetupError as exc:
        parser.error(str(exc))
    check_ports(parser, args, "port")
    if not args.transfer_timeout_s > 0:
        parser.error("--transfer-timeout-s must be > 0")
    return run_worker("prefill_worker", args, config_from_args, build_prefill_app)
