"""``tandem flip``: switch one worker's role through the router (RouterAdmin.FlipWorker).

    tandem flip 127.0.0.1:7002 --to prefill --router 127.0.0.1:50051 --cluster-secret-file F

The router sends the worker no more of its old role's work, moves its decode streams live to
other decode workers (a decode worker), has it finish the rest and start serving ``--to``
with its weights loaded, then counts it in its new pool. Only a worker started to flip
(``python -m tandem.worker.dual``) can. The last routable worker of a role flips only with
``--force``. WORKER is the worker's gRPC endpoint or worker id; the call carries the cluster
credential's token: only a cluster member may flip.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from tandem.cli.router_admin import add_admin_args, call_admin
from tandem.common.arg_parser import ArgParser
from tandem.protos.v1 import worker_pb2

ROLES = {"prefill": worker_pb2.ROLE_PREFILL, "decode": worker_pb2.ROLE_DECODE}


def build_parser() -> ArgParser:
    """The command's flags."""
    p = ArgParser(prog="tandem flip", description=__doc__.split("\n\n")[0])
    p.add_argument("--to", choices=sorted(ROLES), required=True, help="the new role")
    p.add_argument("--force", action="store_true",
                   help="flip even the last routable worker of its role")
    add_admin_args(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Flip; print what moved and how long it took. 1 when the router refused or could not be
    reached (the reason on stderr)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    reply = call_admin(parser, args, lambda stub: stub.FlipWorker(
        worker_pb2.FlipWorkerRequest(worker=args.worker, to=ROLES[args.to], force=args.force),
        timeout=args.timeout))
    if reply is None:
        return 1
    moved = reply.moved
    print(f"{moved.endpoint} serves {args.to} ({reply.seconds:.3f} s; {moved.moved} streams "
          f"moved live, {moved.stayed} finished there first)")
    for reason in moved.reasons:
        print(f"  stayed: {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
