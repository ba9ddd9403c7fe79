"""The RouterAdmin channel the operator's commands share (``tandem drain``, ``tandem flip``):
their common flags, a stub whose every call carries the cluster credential's token, and one
call made with them."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import grpc

from tandem.common.arg_parser import ArgParser
from tandem.common.security.credential import ClusterCredential, CredentialError
from tandem.common.security.grpc_auth import ROUTER_AUDIENCE, sync_channel
from tandem.protos.v1 import worker_pb2_grpc


def add_admin_args(p: ArgParser) -> None:
    """WORKER, the router's address, the credential, the router's CA and the timeout."""
    p.add_argument("worker", help="the worker's gRPC endpoint (host:port) or worker id")
    p.add_argument("--router", default="127.0.0.1:50051", help="the router's gRPC address")
    p.add_argument("--cluster-secret-file", required=True,
                   help="the cluster credential (the router answers members only)")
    p.add_argument("--router-ca", default=None, help="CA of the router's TLS certificate")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the reply")


def admin_channel(args: argparse.Namespace) -> grpc.Channel:
    """A channel to ``args.router`` (TLS when ``--router-ca`` is given)."""
    if args.router_ca:
        tls = grpc.ssl_channel_credentials(Path(args.router_ca).read_bytes())
        return grpc.secure_channel(args.router, tls)
    return grpc.insecure_channel(args.router)


def admin_stub(channel: grpc.Channel, credential: ClusterCredential
               ) -> worker_pb2_grpc.RouterAdminStub:
    """RouterAdmin over ``channel``, every call with ``credential``'s token."""
    return worker_pb2_grpc.RouterAdminStub(sync_channel(channel, credential, ROUTER_AUDIENCE))


Reply = TypeVar("Reply")


def call_admin(parser: ArgParser, args: argparse.Namespace,
               call: Callable[[worker_pb2_grpc.RouterAdminStub], Reply]) -> Reply | None:
    """``call`` on the router's RouterAdmin as ``args`` say (add_admin_args); a credential
    that cannot be read is the parser's error; None (the status and reason on stderr, as
    ``parser.prog``) when the router refused or could not be reached."""
    try:
        credential = ClusterCredential.from_file(args.cluster_secret_file)
    except CredentialError as exc:
        parser.error(str(exc))
    with admin_channel(args) as channel:
        try:
            return call(admin_stub(channel, credential))
        except grpc.RpcError as err:
            print(f"{parser.prog}: {err.code().name}: {err.details()}", file=sys.stderr)
            return None
