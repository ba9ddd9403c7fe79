"""The router's side of proving membership: challenge a worker, check its answer.

    nonce (32 fresh bytes) ──Membership/Prove {nonce, audience: the endpoint dialed}──> worker
    <── {proof, role}: verified when proof == member_proof(nonce, endpoint, role) under the
        cluster credential and the role is the one its pod is labelled with

Kubernetes discovery admits a Ready pod to the pool only after this passes
(k8s_discovery.RegistrySink). Under ``--insecure`` there is no credential to prove, so every
pod passes without a call (as every caller passes the workers' interceptor).
"""

from __future__ import annotations

import secrets

import grpc

from tandem.common.security.credential import ClusterCredential
from tandem.placement.worker_view import Role
from tandem.protos.v1 import worker_pb2
from tandem.router.convert.membership import role_from_proto
from tandem.router.membership.worker_clients import WorkerClients

NONCE_BYTES = 32


class MemberProver:
    """Challenges workers through ``clients`` under ``credential``."""

    def __init__(self, clients: WorkerClients, credential: ClusterCredential,
                 timeout_s: float = 5.0) -> None:
        self._clients = clients
        self._credential = credential
        self._timeout_s = timeout_s

    async def prove(self, role: Role, endpoint: str) -> str | None:
        """None when the worker at ``endpoint`` proved it holds the credential as a ``role``
        worker; else why it did not (for the log)."""
        if self._credential.insecure:
            return None
        nonce = secrets.token_bytes(NONCE_BYTES)
        request = worker_pb2.ProveRequest(nonce=nonce, audience=endpoint)
        try:
            reply = await self._clients.membership(endpoint).Prove(request,
                                                                   timeout=self._timeout_s)
        except grpc.aio.AioRpcError as err:
            return f"Prove failed: {err.code().name}: {err.details()}"
        claimed = role_from_proto(reply.role)
        if claimed is not role:
            return f"it answers as a {claimed.value if claimed else 'roleless'} worker"
        if not self._credential.check_member_proof(reply.proof, nonce, endpoint, role.value):
            return "its proof does not verify (another cluster's secret, or none)"
        return None
