"""``python -m tandem.worker.decode --port P --kv-port Q [engine flags]`` (and ``tandem decode``)."""

from __future__ import annotations

import argparse
import ipaddress
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
from tandem.worker.decode.app import DecodeAppConfig, build_decode_app


def build_parser() -> argparse.ArgumentParser:
    """The decode worker's flags: its KV receiver and lease, then every worker's flags."""
    p = ArgParser(prog="decode_worker", description="Tandem decode worker", config_file=True)
    p.add_argument("--kv-port", type=int, required=True, help="KV receiver TCP port (0: free)")
    p.add_argument("--kv-host", default=None, help="KV listen address (default: --host)")
    p.add_argument(
        "--kv-advertise-host", default=None, metavar="HOST",
        help="the host prefill workers are told to push KV to, on the KV port (default: the "
             "KV listen address); for a worker reached through NAT, a Service or a proxy")
    p.add_argument("--default-lease-s", type=float, default=30.0)
    add_worker_args(p, host_help="gRPC (and KV) listen address",
                    shm_help="TCP only, no shared memory")
    return p


def config_from_args(args: argparse.Namespace) -> DecodeAppConfig:
    """The decode worker's config from its flags (reads the secret and TLS files)."""
    return DecodeAppConfig(worker=worker_config(args, "decode"), kv_port=args.kv_port,
                           kv_host=args.kv_host, kv_advertise_host=args.kv_advertise_host,
                           default_lease_s=args.default_lease_s)


def advertise_host_error(host: str) -> str | None:
    """Why ``host`` cannot be advertised as the KV host (None: it can): it must be one host
    name or IP address a peer can dial, without a port (the KV port is advertised with it),
    and not a wildcard address."""
    if not host or host != host.strip() or any(c in host for c in " |,=/[]"):
        return f"{host!r} is not a host name or IP address"
    if ":" in host:  # only an IPv6 address has a colon; host:port does not belong here
        try:
            address: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.IPv6Address(host)
        except ValueError:
            return f"{host!r}: a host without a port (the KV port is advertised with it)"
    else:
        try:
            address = ipaddress.IPv4Address(host)
        except ValueError:
            return None  # a host name
    if address.is_unspecified:
        return f"{host!r} is a wildcard address, which no peer can dial"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run a decode worker until SIGTERM; returns the exit status (2: bad flags/busy port)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        setup_observability(args, "decode")
    except TracingSetupError as exc:
        parser.error(str(exc))
    check_ports(parser, args, "port", "kv_port")
    if args.kv_advertise_host is not None:
        why = advertise_host_error(args.kv_advertise_host)
        if why is not None:
            parser.error(f"--kv-advertise-host: {why}")
    return run_worker("decode_worker", args, config_from_args, build_decode_app)
