"""``tandem.v1.RouterAdmin``: the operator's surface on the router's gRPC port, for cluster
members only (the cluster credential's per-call token, checked by the server's interceptor
as for the Registry; `tandem drain` mints it from the cluster's credential file).

    DrainWorker(worker, migrate)
      ──> the registry routes it no new work (Registry.drain)
      ──> WorkerControl.Drain: the worker takes no new work and exits once idle
      ──> migrate (a decode worker): every stream on it moves live to another decode worker
          (tandem/router/handoff/live_moves.py); each that cannot move finishes there
      <── how many moved, how many stayed and why, the seconds it took

Without migrate the reply comes once the worker was told; its streams finish where they are.
"""

from __future__ import annotations

import logging
import time

import grpc

from tandem.placement.worker_view import Role
from tandem.protos.v1 import worker_pb2, worker_pb2_grpc
from tandem.router.handoff import legs
from tandem.router.handoff.deps import HandoffDeps
from tandem.router.handoff.live_moves import MoveCause, move_all

log = logging.getLogger(__name__)

SERVICE_NAME = worker_pb2.DESCRIPTOR.services_by_name["RouterAdmin"].full_name


class RouterAdminServicer(worker_pb2_grpc.RouterAdminServicer):
    """Drains a worker on an operator's word (see the module docstring)."""

    def __init__(self, deps: HandoffDeps) -> None:
        self._deps = deps
        config = deps.config
        self._calls = legs.LegCalls(deps.clients, deps.inflight, config.rpc_timeout_s,
                                    config.prefill_timeout_s)

    async def DrainWorker(  # noqa: N802 (gRPC method names)
        self, request: worker_pb2.DrainWorkerRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.DrainWorkerResponse:
        registry = self._deps.registry
        endpoint = registry.endpoint_of(request.worker)
        if endpoint is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no worker {request.worker!r}")
        assert endpoint is not None
        t0 = time.monotonic()
        registry.drain(endpoint)
        log.info("draining worker %s on an operator's word%s", endpoint,
                 " (its streams move)" if request.migrate else "")
        try:
            await self._deps.clients.control(endpoint).Drain(
                worker_pb2.DrainRequest(), timeout=self._calls.rpc_timeout_s)
        except grpc.aio.AioRpcError as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"the worker did not take the drain: {err.code().name}: "
                                f"{err.details()}")
        outcomes = []
        if request.migrate and registry.role_of(endpoint) is Role.DECODE:
            outcomes = await move_all(self._deps.live, self._calls, endpoint, MoveCause.DRAIN)
        stayed = [o.reason for o in outcomes if not o.moved]
        seconds = time.monotonic() - t0
        log.info("worker %s drained: %d streams moved, %d stayed, in %.3f s", endpoint,
                 len(outcomes) - len(stayed), len(stayed), seconds)
        return worker_pb2.DrainWorkerResponse(
            endpoint=endpoint, moved=len(outcomes) - len(stayed), stayed=len(stayed),
            reasons=stayed, seconds=seconds)
