"""The worker's side of proving membership: it answers the router's challenge with an HMAC.

    router ──Membership/Prove {nonce, audience}──> worker (the call carries the router's token)
        audience is one of this worker's names?  no -> PERMISSION_DENIED
        yes -> {proof: member_proof(nonce, audience, role), role}

Routers that find workers by themselves (Kubernetes discovery) route to a pod only once its
proof verifies: a pod that merely carries the right labels never gets traffic. The challenge
names the address the router dialed, and a worker answers only for its own addresses, so an
impostor cannot relay the challenge to a real worker and pass its answer off as its own.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import grpc

from tandem.common.security.credential import ClusterCredential
from tandem.protos.v1 import worker_pb2, worker_pb2_grpc

MIN_NONCE_BYTES, MAX_NONCE_BYTES = 16, 64
_ROLES = {"prefill": worker_pb2.ROLE_PREFILL, "decode": worker_pb2.ROLE_DECODE}


class MembershipServicer(worker_pb2_grpc.MembershipServicer):
    """``tandem.v1.Membership`` for a worker of ``role`` answering to ``audience``
    (``role`` a callable for a worker that flips: the role it serves when asked)."""

    def __init__(self, credential: ClusterCredential, role: str | Callable[[], str],
                 audience: Collection[str]) -> None:
        self._credential = credential
        self._role = role if callable(role) else (lambda: role)
        self._audience = frozenset(audience)

    async def Prove(  # noqa: N802 - gRPC method name
        self, request: worker_pb2.ProveRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.ProveResponse:
        """The proof that this worker holds the cluster credential, for this challenge."""
        if not MIN_NONCE_BYTES <= len(request.nonce) <= MAX_NONCE_BYTES:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"nonce: {MIN_NONCE_BYTES}..{MAX_NONCE_BYTES} bytes")
        if request.audience not in self._audience:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                "the challenge names an address this worker does not answer to")
        role = self._role()
        proof = self._credential.member_proof(request.nonce, request.audience, role)
        return worker_pb2.ProveResponse(proof=proof, role=_ROLES[role])
