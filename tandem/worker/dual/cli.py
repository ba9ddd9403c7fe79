"""``python -m tandem.worker.dual --role decode|prefill --port P --kv-port Q [flags]``: a
worker that serves ``--role`` first and flips on the router's word (WorkerControl.Flip). Its
flags are the decode worker's (the KV receiver it starts whenever it serves decode) plus the
prefill worker's ``--transfer-timeout-s``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from tandem.common.obs.tracing_setup import TracingSetupError
from tandem.worker.cli import check_ports, run_worker, setup_observability
from tandem.worker.decode import cli as decode_cli
from tandem.worker.dual.app import ROLES, DualAppConfig, build_dual_app
from tandem.worker.prefill.app import PrefillAppConfig


def build_parser() -> argparse.ArgumentParser:
    """The decode worker's flags, the first role and the prefill role's push timeout."""
    p = decode_cli.build_parser()
    p.prog = "worker"
    p.description = "Tandem worker that flips between prefill and decode"
    p.add_argument("--role", choices=ROLES, required=True, help="the role served first")
    p.add_argument("--transfer-timeout-s", type=float, default=30.0,
                   help="as prefill: from a Prefill's arrival to its COMMIT's ACK")
    return p


def config_from_args(args: argparse.Namespace) -> DualAppConfig:
    """Both roles' configs from the flags (one WorkerConfig)."""
    decode = decode_cli.config_from_args(args)
    return DualAppConfig(args.role, decode, PrefillAppConfig(
        worker=decode.worker, transfer_timeout_s=args.transfer_timeout_s))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the worker until SIGTERM; returns the exit status (2: bad flags/busy port)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        setup_observability(args, args.role)
    except TracingSetupError as exc:
        parser.error(str(exc))
    check_ports(parser, args, "port", "kv_port")
    if not args.transfer_timeout_s > 0:
        parser.error("--transfer-timeout-s must be > 0")
    if args.kv_advertise_host is not None:
        why = decode_cli.advertise_host_error(args.kv_advertise_host)
        if why is not None:
            parser.error(f"--kv-advertise-host: {why}")
    return run_worker("worker", args, config_from_args, build_dual_app)
