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
    FlipWorker(worker, to, force): refused as tandem/router/flips.py says, else
      ──> the registry routes it none of its old role's work (Registry.drain)
      ──> a decode worker: its streams move live as for a drain with migrate
      ──> WorkerControl.Flip(to): the worker finishes its old role's work, starts the new one
      ──> the registry counts it in its new pool (Registry.serve_as); a worker that refused
          (one that serves a single role) stays in its old pool, the reason in the reply

Without migrate the reply comes once the worker was told; its streams finish where they are.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from tandem.placement.worker_view import Role
from tandem.protos.v1 import worker_pb2, worker_pb2_grpc
from tandem.router.convert.membership import ROLE_PROTOS, role_from_proto
from tandem.router.flips import flip_refusal
from tandem.router.handoff import legs
from tandem.router.handoff.deps import HandoffDeps
from tandem.router.handoff.live_moves import MoveCause, MoveOutcome, move_all

log = logging.getLogger(__name__)

SERVICE_NAME = worker_pb2.DESCRIPTOR.services_by_name["RouterAdmin"].full_name


class RouterAdminServicer(worker_pb2_grpc.RouterAdminServicer):
    """Drains, moves off or flips a worker on an operator's word (the module docstring)."""

    def __init__(self, deps: HandoffDeps) -> None:
        self._deps = deps
        config = deps.config
        self._calls = legs.LegCalls(deps.clients, deps.inflight, config.rpc_timeout_s,
                                    config.prefill_timeout_s)
        self._flipping: set[str] = set()  # endpoints with a flip in progress

    async def DrainWorker(  # noqa: N802 (gRPC method names)
        self, request: worker_pb2.DrainWorkerRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.MovedStreams:
        registry = self._deps.registry
        endpoint = await self._known(request.worker, context)
        t0 = time.monotonic()
        migrate = request.migrate and registry.role_of(endpoint) is Role.DECODE
        if migrate:
            self._deps.live.moving_off(endpoint, MoveCause.DRAIN)
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

    async def FlipWorker(  # noqa: N802
        self, request: worker_pb2.FlipWorkerRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.FlipWorkerResponse:
        registry = self._deps.registry
        to = role_from_proto(request.to)
        if to is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "to: must be ROLE_PREFILL or ROLE_DECODE")
        assert to is not None
        endpoint = await self._known(request.worker, context)
        old = registry.role_of(endpoint)
        assert old is not None
        why = flip_refusal(registry, endpoint, old, to, request.force,
                           endpoint in self._flipping)
        if why:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, why)
        # The flip runs to its end even if the caller goes away (a half-done flip would
        # leave the worker out of both pools): the call only waits for it.
        self._flipping.add(endpoint)
        flip = asyncio.get_running_loop().create_task(self._flip(endpoint, old, to))

        def ended(task: asyncio.Task[worker_pb2.FlipWorkerResponse]) -> None:
            self._flipping.discard(endpoint)
            if not task.cancelled():
                task.exception()  # retrieved: a caller gone does not leave it unread

        flip.add_done_callback(ended)
        try:
            return await asyncio.shield(flip)
        except _FlipFailed as failed:
            await context.abort(failed.code, failed.details)
            raise  # unreachable: abort raises

    async def _flip(self, endpoint: str, old: Role, to: Role) -> worker_pb2.FlipWorkerResponse:
        """No more of ``old``'s work to it, its streams moved off, the worker's switch, then
        the new pool (the old one again when the worker refused: _FlipFailed)."""
        registry = self._deps.registry
        t0 = time.monotonic()
        if old is Role.DECODE:
            self._deps.live.moving_off(endpoint, MoveCause.FLIP)
        registry.drain(endpoint, move_streams=old is Role.DECODE)
        log.info("flipping worker %s from %s to %s on an operator's word", endpoint,
                 old.value, to.value)
        outcomes = []
        if old is Role.DECODE:
            outcomes = await move_all(self._deps.live, self._calls, endpoint, MoveCause.FLIP)
        moved = _report(endpoint, outcomes, t0)
        try:
            # the worker waits for its old role's work (bounded by its drain timeout)
            await self._deps.clients.control(endpoint).Flip(
                worker_pb2.FlipRequest(to=ROLE_PROTOS[to]))
        except grpc.aio.AioRpcError as err:
            registry.serve_as(endpoint, old)
            code = err.code()
            raise _FlipFailed(
                code if code is grpc.StatusCode.FAILED_PRECONDITION
                else grpc.StatusCode.UNAVAILABLE,
                f"the worker did not flip: {code.name}: {err.details()}") from err
        registry.serve_as(endpoint, to)
        seconds = time.monotonic() - t0
        log.info("worker %s serves %s after a flip of %.3f s", endpoint, to.value, seconds)
        return worker_pb2.FlipWorkerResponse(moved=moved, seconds=seconds)

    async def _known(self, worker: str, context: grpc.aio.ServicerContext) -> str:
        """The endpoint of a worker the registry knows; NOT_FOUND for any other."""
        endpoint = self._deps.registry.endpoint_of(worker)
        if endpoint is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no worker {worker!r}")
        assert endpoint is not None
        return endpoint


class _FlipFailed(Exception):
    """The worker did not flip: the status the caller gets."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


def _report(endpoint: str, outcomes: list[MoveOutcome], t0: float) -> worker_pb2.MovedStreams:
    """What the moves off ``endpoint`` came to (logged too)."""
    stayed = [o.reason for o in outcomes if not o.moved]
    seconds = time.monotonic() - t0
    log.info("worker %s: %d streams moved live, %d stayed, in %.3f s", endpoint,
             len(outcomes) - len(stayed), len(stayed), seconds)
    return worker_pb2.MovedStreams(endpoint=endpoint, moved=len(outcomes) - len(stayed),
                                   stayed=len(stayed), reasons=stayed, seconds=seconds)
