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

from tandem.cli.router_admin import add_admin_args, call_admin
from tandem.common.arg_parser import ArgParser
from tandem.protos.v1 import worker_pb2


def build_parser() -> ArgParser:
    """The command's flags."""
    p = ArgParser(prog="tandem drain", description=__doc__.split("\n\n")[0])
    p.add_argument("--migrate", action="store_true",
                   help="move the worker's decode streams live to other decode workers")
    add_admin_args(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Drain; print what moved. 1 when the router refused or could not be reached."""
    parser = build_parser()
    args = parser.parse_args(argv)
    reply = call_admin(parser, args, lambda stub: stub.DrainWorker(
        worker_pb2.DrainWorkerRequest(worker=args.worker, migrate=args.migrate),
        timeout=args.timeout))
    if reply is None:
        return 1
    moved = f"{reply.moved} streams moved live, " if args.migrate else ""
    print(f"draining {reply.endpoint}: {moved}{reply.stayed} stay to finish there "
          f"({reply.seconds:.3f} s)")
    for reason in reply.reasons:
        print(f"  stayed: {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
