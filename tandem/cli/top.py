"""``tandem top``: a live terminal view of every worker, from their Stats RPCs.

    tandem top --workers 127.0.0.1:7001,127.0.0.1:7002 [--router-http 127.0.0.1:8000]
               [--interval 2] [--once]

One row per worker: role, state, running and waiting requests, reservations, KV cache use,
leased blocks, prefix-cache hit rate, TTFT and ITL p50/p90 over the worker's last minute,
KV transfer rate and preemptions. A worker that does not answer shows as ``down`` and keeps
its row. With ``--router-http``, a first line shows the router from its ``/metrics``:
running and queued requests, outcomes, TTFT and ITL percentiles since it started. ``--once``
prints one frame and exits (scripts, tests).

The router does not publish its worker list, so the endpoints are given here (``tandem
local`` and ``tandem status`` print them).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from tandem.cli.main import has_package, missing_package
from tandem.cli.router_view import fetch_metrics, parse_router_metrics, render_router
from tandem.common.arg_parser import ArgParser
from tandem.common.security.credential import ClusterCredential, CredentialError
from tandem.common.security.grpc_auth import sync_channel
from tandem.protos.v1 import worker_pb2, worker_pb2_grpc
from tandem.sdk.errors import from_rpc_error

_ROLES = {worker_pb2.ROLE_PREFILL: "prefill", worker_pb2.ROLE_DECODE: "decode"}
_HEADER = ("WORKER", "ROLE", "STATE", "RUN", "WAIT", "RSV", "KV", "BLOCKS", "LEASED",
           "PREFIX", "TTFT p50/p90", "ITL p50/p90", "XFER/s", "PREEMPT")
CLEAR = "\x1b[H\x1b[2J"


@dataclass(frozen=True, slots=True)
class WorkerRow:
    """One worker's latest Stats (None with ``error`` set when it did not answer)."""

    endpoint: str
    stats: worker_pb2.WorkerStats | None
    error: str = ""


def _ms_pair(p50_s: float, p90_s: float) -> str:
    if p50_s <= 0 and p90_s <= 0:
        return "-"
    return f"{p50_s * 1e3:.0f}/{p90_s * 1e3:.0f} ms"


def _rate(bytes_per_s: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.1f} {unit}"
    return f"{bytes_per_s:.0f} B"


def row_cells(row: WorkerRow) -> tuple[str, ...]:
    """The table cells of one worker."""
    s = row.stats
    if s is None:
        return (row.endpoint, "?", "down", *("-" for _ in _HEADER[3:]))
    used = s.num_blocks - s.num_free_blocks
    hit = f"{s.prefix_cache_hits / s.prefix_cache_queries:.0%}" if s.prefix_cache_queries else "-"
    return (
        row.endpoint,
        _ROLES.get(s.role, "?"),
        "draining" if s.draining else "ok",
        str(s.num_running),
        str(s.num_waiting),
        str(s.num_reserved),
        f"{s.kv_cache_usage:.0%}",
        f"{used}/{s.num_blocks}",
        str(s.num_leased_blocks),
        hit,
        _ms_pair(s.ttft_p50_s, s.ttft_p90_s),
        _ms_pair(s.itl_p50_s, s.itl_p90_s),
        _rate(s.kv_transfer_bytes_per_s),
        str(s.num_preemptions),
    )


def render(rows: Sequence[WorkerRow], title: str = "") -> str:
    """A fixed-width table of ``rows`` (pure: the same rows give the same frame)."""
    table = [_HEADER, *(row_cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(_HEADER))]
    lines = [title] if title else []
    for line in table:
        lines.append("  ".join(c.ljust(w) if i < 3 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(line, widths, strict=True))).rstrip())
    down = [r for r in rows if r.stats is None]
    for r in down:
        lines.append(f"{r.endpoint}: {r.error}")
    return "\n".join(lines)


class WorkerPoller:
    """Asks each worker for its Stats; learns on first contact whether it is a prefill or a
    decode worker (the two services share the Stats message)."""

    def __init__(self, endpoints: Sequence[str],
                 credentials: grpc.ChannelCredentials | None = None,
                 cluster: ClusterCredential | None = None) -> None:
        """``cluster``: the cluster credential the workers' Stats RPC needs (None: an insecure
        cluster's workers)."""
        self.endpoints = list(endpoints)
        cluster = cluster or ClusterCredential.insecure_default()
        self._channels = {
            e: sync_channel(grpc.secure_channel(e, credentials) if credentials is not None
                            else grpc.insecure_channel(e), cluster, e)
            for e in self.endpoints
        }
        self._stub: dict[str, object] = {}

    def poll(self, timeout_s: float = 2.0) -> list[WorkerRow]:
        """One Stats round over every worker."""
        return [self._one(e, timeout_s) for e in self.endpoints]

    def _one(self, endpoint: str, timeout_s: float) -> WorkerRow:
        channel = self._channels[endpoint]
        known = self._stub.get(endpoint)
        candidates = [known] if known is not None else [
            worker_pb2_grpc.DecodeServiceStub(channel), worker_pb2_grpc.PrefillServiceStub(channel)]
        error = ""
        for stub in candidates:
            try:
                stats = stub.Stats(  # type: ignore[attr-defined]
                    worker_pb2.StatsRequest(), timeout=timeout_s
                )
            except grpc.RpcError as err:
                typed = from_rpc_error(err)
                error = str(typed)
                if typed.code == "UNIMPLEMENTED":
                    continue  # the other role's service
                break
            self._stub[endpoint] = stub
            return WorkerRow(endpoint, stats)
        return WorkerRow(endpoint, None, error)

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()


def _credentials(args: argparse.Namespace) -> grpc.ChannelCredentials | None:
    if not (args.worker_ca or args.worker_cert or args.worker_key):
        return None
    def read(p: str | None) -> bytes | None:
        return Path(p).read_bytes() if p else None
    return grpc.ssl_channel_credentials(read(args.worker_ca), read(args.worker_key),
                                        read(args.worker_cert))


def build_parser() -> argparse.ArgumentParser:
    p = ArgParser(prog="tandem top", description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", required=True, help="worker gRPC endpoints, HOST:PORT,...")
    p.add_argument("--router-http", default=None,
                   help="router's HTTP HOST:PORT (or URL) for a router line from /metrics")
    p.add_argument("--router-ca", default=None, help="CA to verify an https --router-http")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between frames")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--worker-ca", default=None, help="CA of the workers' certificates (mTLS)")
    p.add_argument("--worker-cert", default=None, help="client certificate for the workers")
    p.add_argument("--worker-key", default=None, help="its private key")
    p.add_argument("--cluster-secret-file", default=None,
                   help="the cluster credential (workers answer Stats only to members)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Print frames until Ctrl-C (or one with --once); 1 if --once found a worker down."""
    parser = build_parser()
    args = parser.parse_args(argv)
    endpoints = [e.strip() for e in args.workers.split(",") if e.strip()]
    if not endpoints:
        parser.error("--workers names no endpoint")
    if args.interval <= 0:
        parser.error("--interval must be > 0")
    if args.router_http is not None and not has_package("prometheus_client"):
        parser.error(f"--router-http {missing_package('prometheus_client')}")
    try:
        cluster = (ClusterCredential.from_file(args.cluster_secret_file)
                   if args.cluster_secret_file else None)
    except CredentialError as exc:
        parser.error(str(exc))
    poller = WorkerPoller(endpoints, _credentials(args), cluster)

    def router_line() -> str:
        if args.router_http is None:
            return ""
        try:
            text = fetch_metrics(args.router_http, args.router_ca)
        except (OSError, ValueError) as err:
            return f"router {args.router_http}: unreachable ({err})"
        return render_router(args.router_http, parse_router_metrics(text))

    try:
        if args.once:
            rows = poller.poll()
            print(render(rows, router_line()))
            return 1 if any(r.stats is None for r in rows) else 0
        while True:
            title = f"tandem top  {time.strftime('%H:%M:%S')}  ({len(endpoints)} workers)"
            line = router_line()
            frame = render(poller.poll(), f"{title}\n{line}" if line else title)
            sys.stdout.write(CLEAR + frame + "\n")
            sys.stdout.flush()
            time.sleep(args.interval)  # the refresh period of a live view
    except KeyboardInterrupt:
        return 0
    finally:
        poller.close()
