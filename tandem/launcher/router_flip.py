"""The pool actor's way to flip a worker: through the router it serves (RouterAdmin.FlipWorker,
the cluster credential's token on the call), so the router stops sending the worker its old
role's work, moves its decode streams off and counts it in its new pool (docs/design.md,
"Role flips")."""

from __future__ import annotations

import grpc

from tandem.common.security.credential import ClusterCredential
from tandem.common.security.grpc_auth import ROUTER_AUDIENCE, aio_interceptors
from tandem.protos.v1 import worker_pb2, worker_pb2_grpc

_ROLES = {"prefill": worker_pb2.ROLE_PREFILL, "decode": worker_pb2.ROLE_DECODE}


class FlipFailedError(RuntimeError):
    """The router refused the flip or could not make it (the message says why)."""


async def flip_via_router(router: str, secret_hex: str, worker_id: str, to_role: str,
                          timeout_s: float = 300.0) -> worker_pb2.FlipWorkerResponse:
    """Ask the router at ``router`` to flip ``worker_id`` to ``to_role`` (``secret_hex``: the
    cluster credential; "" for an insecure cluster). Raises FlipFailedError."""
    credential = (ClusterCredential.from_hex(secret_hex) if secret_hex
                  else ClusterCredential.insecure_default())
    async with grpc.aio.insecure_channel(
            router, interceptors=aio_interceptors(credential, ROUTER_AUDIENCE)) as channel:
        try:
            return await worker_pb2_grpc.RouterAdminStub(channel).FlipWorker(
                worker_pb2.FlipWorkerRequest(worker=worker_id, to=_ROLES[to_role]),
                timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            raise FlipFailedError(f"{worker_id} to {to_role}: {err.code().name}: "
                                  f"{err.details()}") from err
