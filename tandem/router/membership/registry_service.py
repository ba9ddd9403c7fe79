"""The ``tandem.v1.Registry`` service on the router's port: workers join and heartbeat."""

from __future__ import annotations

import math

import grpc

from tandem.common import block_hash
from tandem.placement.worker_view import Role
from tandem.protos.v1 import worker_pb2, worker_pb2_grpc
from tandem.router.errors import InvalidRequestError
from tandem.router.membership.registry import Registry, WorkerLoad
from tandem.router.status import abort_with

_ROLES = {worker_pb2.ROLE_PREFILL: Role.PREFILL, worker_pb2.ROLE_DECODE: Role.DECODE}


def load_of(stats: worker_pb2.WorkerStats) -> WorkerLoad:
    """The policy-relevant part of a WorkerStats message."""
    return WorkerLoad(
        num_running=stats.num_running,
        num_waiting=stats.num_waiting,
        num_free_blocks=stats.num_free_blocks,
        num_blocks=stats.num_blocks,
        draining=stats.draining,
        step_base_s=_optional(stats, "step_base_s"),
        step_per_row_s=_optional(stats, "step_per_row_s"),
        step_per_prefill_token_s=_optional(stats, "step_per_prefill_token_s"),
        queued_prefill_tokens=stats.pending_prefill_tokens,
        max_batched_tokens=stats.max_batched_tokens,
        cached_blocks=block_hash.unpack(stats.cached_block_hashes),
        weights_format=stats.weights_format[:200],  # a report, not trusted to be short
    )


def _optional(stats: worker_pb2.WorkerStats, name: str) -> float | None:
    """An optional cost figure; None when the worker has not measured it (or sent nonsense)."""
    if not stats.HasField(name):  # type: ignore[arg-type]
        return None
    value = float(getattr(stats, name))
    return value if math.isfinite(value) and value >= 0 else None


class RegistryServicer(worker_pb2_grpc.RegistryServicer):
    """Thin wrapper over Registry."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    async def Register(  # noqa: N802 - gRPC method name
        self, request: worker_pb2.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.RegisterResponse:
        """Add (or re-add) a worker to the pool."""
        role = _ROLES.get(request.role)
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
