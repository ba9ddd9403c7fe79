"""``tandem drain``: drain one worker through the router (RouterAdmin.DrainWorker).

    tandem drain 127.0.0.1:7002 --router 127.0.0.1:50051 --cluster-secret-file F [--migrate]

The router sends the worker no new work and tells it to drain: it exits once idle. With
``--migrate`` (a decode worker) every stream on it moves live to another decode worker, KV and
all, so the drain takes seconds rather than the longest stream's remaining time; a stream
that cannot move finishes where it is. WORKER is the worker's gRPC endpoint or worker id.
The call carries the cluster credential's token: only a cluster member may drain.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import grpc

from tandem.common.arg_parser import ArgParser
from tandem.common.security.credential import ClusterCredential, CredentialError
from tandem.common.security.grpc_auth import ROUTER_AUDIENCE, sync_channel
from tandem.protos.v1 import worker_pb2, worker_pb2_grpc


def build_parser() -> ArgParser:
    """The command's flags."""
    p = ArgParser(prog="tandem drain", description=__doc__.split("\n\n")[0])
    p.add_argument("worker", help="the worker's gRPC endpoint (host:port) or worker id")
    p.add_argument("--router", default="127.0.0.1:50051", help="the router's gRPC address")
    p.add_argument("--migrate", action="store_true",
                   help="move the worker's decode streams live to other decode workers")
    p.add_argument("--cluster-secret-file", required=True,
                   help="the cluster credential (the router drains for members only)")
    p.add_argument("--router-ca", default=None, help="CA of the router's TLS certificate")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the reply")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Drain; print what moved. 1 when the router refused or could not be reached."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        credential = ClusterCredential.from_file(args.cluster_secret_file)
    except CredentialError as exc:
        parser.error(str(exc))
    if args.router_ca:
        tls = grpc.ssl_channel_credentials(Path(args.router_ca).read_bytes())
        channel = grpc.secure_channel(args.router, tls)
    else:
        channel = grpc.insecure_channel(args.router)
    with channel:
        stub = worker_pb2_grpc.RouterAdminStub(sync_channel(channel, credential,
                                                            ROUTER_AUDIENCE))
        try:
            reply = stub.DrainWorker(
                worker_pb2.DrainWorkerRequest(worker=args.worker, migrate=args.migrate),
                timeout=args.timeout)
        except grpc.RpcError as err:
            print(f"tandem drain: {err.code().name}: {err.details()}", file=sys.stderr)
            return 1
    moved = f"{reply.moved} streams moved live, " if args.migrate else ""
    print(f"draining {reply.endpoint}: {moved}{reply.stayed} stay to finish there "
          f"({reply.seconds:.3f} s)")
    for reason in reply.reasons:
        print(f"  stayed: {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
