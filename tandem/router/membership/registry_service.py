"""The ``tandem.v1.Registry`` service on the router's port: workers join and heartbeat.

Protobufs stop here: a Register becomes its role, endpoint and id, a Heartbeat its worker id
and load (tandem/router/convert/membership.py), which is all the registry is told.
"""

from __future__ import annotations

import grpc

from tandem.protos.v1 import worker_pb2, worker_pb2_grpc
from tandem.router.convert.membership import load_of, role_from_proto
from tandem.router.errors import InvalidRequestError
from tandem.router.membership.registry import Registry
from tandem.router.status import abort_with


class RegistryServicer(worker_pb2_grpc.RegistryServicer):
    """Thin wrapper over Registry."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    async def Register(  # noqa: N802 - gRPC method name
        self, request: worker_pb2.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.RegisterResponse:
        """Add (or re-add) a worker to the pool."""
        role = role_from_proto(request.role)
        if role is None:
            await abort_with(context, InvalidRequestError("role", "must be PREFILL or DECODE"))
        if not request.endpoint:
            await abort_with(context, InvalidRequestError("endpoint", "missing"))
        self._registry.register(role, request.endpoint, request.worker_id)
        return worker_pb2.RegisterResponse(heartbeat_interval_s=self._registry.heartbeat_interval_s)

    async def Heartbeat(  # noqa: N802
        self, request: worker_pb2.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.HeartbeatResponse:
        """Refresh a worker's lease and load; ``known=False`` asks it to register again."""
        load = load_of(request.stats) if request.HasField("stats") else None
        return worker_pb2.HeartbeatResponse(known=self._registry.heartbeat(request.worker_id, load))
