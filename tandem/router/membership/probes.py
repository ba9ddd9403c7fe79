"""The health monitor's worker calls: grpc.health.v1 Check and Stats, answered as plain results.

    check_health(endpoint)  -> Health: SERVING (or no health service) | a problem, and
                               whether the worker could be reached at all
    stats(endpoint, role)   -> WorkerLoad | StatsFailed (late: alive, mid-step; else a failure)

gRPC and its messages stay here (and in tandem/router/convert/membership.py): the monitor
decides on what these return.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2

from tandem.placement.worker_view import Role
from tandem.router.convert.membership import load_of, stats_request
from tandem.router.membership.registry import WorkerLoad
from tandem.router.membership.worker_clients import WorkerClients


@dataclass(frozen=True, slots=True)
class Health:
    """A health check's outcome: ``problem`` None when the worker serves (or has no health
    service: its Stats call decides); ``unreachable`` when the check got no answer at all."""

    problem: str | None = None
    unreachable: bool = False


class StatsFailed(Exception):
    """A Stats call that failed: ``late`` when it ran out its timeout (the worker answered
    its health check, so it is alive but mid-step), else ``code_name`` says why."""

    def __init__(self, code_name: str) -> None:
        super().__init__(f"Stats failed: {code_name}")
        self.code_name = code_name

    @property
    def late(self) -> bool:
        """Whether the call only ran out its time."""
        return self.code_name == "DEADLINE_EXCEEDED"


async def check_health(clients: WorkerClients, endpoint: str, timeout_s: float) -> Health:
    """grpc.health.v1 Check of the worker's overall status."""
    try:
        reply = await clients.health(endpoint).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=timeout_s
        )
    except grpc.aio.AioRpcError as err:
        if err.code() == grpc.StatusCode.UNIMPLEMENTED:
            return Health()  # no health service: the Stats call decides
        return Health(f"health check failed: {err.code().name}", unreachable=True)
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        name = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        return Health(f"health status {name}")
    return Health()


async def stats(clients: WorkerClients, endpoint: str, role: Role, timeout_s: float
                ) -> WorkerLoad:
    """The worker's load, from its Stats; raises StatsFailed."""
    stub = clients.decode(endpoint) if role is Role.DECODE else clients.prefill(endpoint)
    try:
        reply = await stub.Stats(stats_request(), timeout=timeout_s)
    except grpc.aio.AioRpcError as err:
        raise StatsFailed(err.code().name) from err
    return load_of(reply)
