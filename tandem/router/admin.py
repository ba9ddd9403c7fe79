"""``tandem.v1.RouterAdmin``: the operator's surface on the router's gRPC port, for cluster
members only (the cluster credential's per-call token, checked by the server's interceptor
as for the Registry; `tandem drain` mints it from the cluster's credential file).

    DrainWorker(worker, migrate)
      ──> the registry routes it no new work (Registry.drain)
      ──> WorkerControl.Drain: the worker takes no new work and exits once idle
      ──> migrate (a decode worker): every stream on it moves live to another decode worker
          (tandem/router/handoff/live_moves.py); each that cannot move finishes there; one
          still in its prefill then moves as soon as it starts decoding (not in the reply)
      <── how many moved, how many stayed and why, the seconds it took
    MoveStreams(worker): the same moves off a decode worker that stays in the pool (a hot
      worker rebalanced, maintenance ahead of a restart)

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
from tandem.router.handoff.live_moves import MoveCause, MoveOutcome, move_all

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
    ) -> worker_pb2.MovedStreams:
        registry = self._deps.registry
        endpoint = await self._known(request.worker, context)
        t0 = time.monotonic()
        migrate = request.migrate and registry.role_of(endpoint) is Role.DECODE
        registry.drain(endpoint, move_streams=migrate)
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
        if migrate:  # a stream that starts decoding there later moves as it starts (ledger)
            outcomes = await move_all(self._deps.live, self._calls, endpoint, MoveCause.DRAIN)
        return _report(endpoint, outcomes, t0)

    async def MoveStreams(  # noqa: N802
        self, request: worker_pb2.MoveStreamsRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.MovedStreams:
        endpoint = await self._known(request.worker, context)
        if self._deps.registry.role_of(endpoint) is not Role.DECODE:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"{request.worker!r} is not a decode worker")
        t0 = time.monotonic()
        outcomes = await move_all(self._deps.live, self._calls, endpoint, MoveCause.OPERATOR)
        return _report(endpoint, outcomes, t0)

    async def _known(self, worker: str, context: grpc.aio.ServicerContext) -> str:
        """The endpoint of a worker the registry knows; NOT_FOUND for any other."""
        endpoint = self._deps.registry.endpoint_of(worker)
        if endpoint is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no worker {worker!r}")
        assert endpoint is not None
        return endpoint


def _report(endpoint: str, outcomes: list[MoveOutcome], t0: float) -> worker_pb2.MovedStreams:
    """What the moves off ``endpoint`` came to (logged too)."""
    stayed = [o.reason for o in outcomes if not o.moved]
    seconds = time.monotonic() - t0
    log.info("worker %s: %d streams moved live, %d stayed, in %.3f s", endpoint,
             len(outcomes) - len(stayed), len(stayed), seconds)
    return worker_pb2.MovedStreams(endpoint=endpoint, moved=len(outcomes) - len(stayed),
                                   stayed=len(stayed), reasons=stayed, seconds=seconds)
