"""Joining a router: Register once, then Heartbeat with stats at once and at the interval
it returns (the first beat brings the router the worker's load and step costs right away).

    Register ──> Heartbeat(stats) at once, then every interval ──known=false──> Register again
        (a beat never waits on a long engine step for its stats: past half the interval it
        carries the last stats read, and the read in flight serves a later beat; the router
        forgets a worker silent for a few intervals, and a prefill step of 2,048 tokens on two
        shared cores took longer than that)
        (every call carries the cluster credential: membership is proven, never claimed)
        └── router unreachable or erroring: retry with exponential backoff, never crash
        (the channel pings the router, tandem/common/grpc_keepalive.py: a router that went silent
        fails the next call within the keepalive bound, not after TCP gives up)

Shared by both roles. This is the registration's gRPC edge: the worker hands it plain values
(``Registration``, ``WorkerStatus``) and the protos are made here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc

from tandem.common.grpc_keepalive import CLIENT_OPTIONS
from tandem.common.security.credential import ClusterCredential
from tandem.common.security.grpc_auth import ROUTER_AUDIENCE, aio_interceptors
from tandem.protos.v1 import worker_pb2, worker_pb2_grpc
from tandem.worker.convert import registration_to_proto, status_to_proto
from tandem.worker.reports import Registration, WorkerStatus

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RegistrationConfig:
    """Where the router is and how patiently to reach it."""

    router: str  # host:port of the router's gRPC server
    min_backoff_s: float = 0.2
    max_backoff_s: float = 10.0
    rpc_timeout_s: float = 5.0
    default_interval_s: float = 5.0  # when the router answers 0
    credentials: grpc.ChannelCredentials | None = None  # TLS to the router; None: plaintext
    cluster: ClusterCredential | None = None  # proves membership on every call (None: none)


class RegistryClient:
    """Keeps one worker registered with one router for as long as ``run`` runs: ``register``
    says who it is (read at every Register), ``status`` its load (read for the heartbeats)."""

    def __init__(
        self,
        config: RegistrationConfig,
        register: Callable[[], Registration],
        status: Callable[[], Awaitable[WorkerStatus]],
    ) -> None:
        self.config = config
        self._register = register
        self._status = status
        self.registrations = 0  # successful Register calls (re-registrations included)
        self.heartbeats = 0
        self.stale_beats = 0  # beats sent with the previous stats (the engine was mid-step)
        self.failures = 0  # calls that failed (router unreachable or erroring)

    async def run(self) -> None:
        """Register and heartbeat until cancelled."""
        credentials, router = self.config.credentials, self.config.router
        tokens = (aio_interceptors(self.config.cluster, ROUTER_AUDIENCE) if self.config.cluster
                  else [])
        options = list(CLIENT_OPTIONS)
        channel = (grpc.aio.insecure_channel(router, options, interceptors=tokens)
                   if credentials is None
                   else grpc.aio.secure_channel(router, credentials, options,
                                                interceptors=tokens))
        async with channel:
            stub = worker_pb2_grpc.RegistryStub(channel)
            backoff = self.config.min_backoff_s
            while True:
                try:
                    await self._session(stub)
                    backoff = self.config.min_backoff_s  # the router forgot us: at once
                except grpc.aio.AioRpcError as exc:
                    self.failures += 1
                    log.warning("router %s: %s (%s); retrying in %.1fs", self.config.router,
                                exc.code().name, exc.details(), backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, self.config.max_backoff_s)

    async def _session(self, stub: worker_pb2_grpc.RegistryStub) -> None:
        """One registration: heartbeats until the router says it does not know us."""
        registration = self._register()
        reply = await stub.Register(registration_to_proto(registration),
                                    timeout=self.config.rpc_timeout_s)
        self.registrations += 1
        interval = reply.heartbeat_interval_s or self.config.default_interval_s
        worker_id = registration.worker_id
        log.info("registered with router %s as %s (heartbeat every %.1fs)",
                 self.config.router, worker_id, interval)
        reading: asyncio.Future[worker_pb2.WorkerStats] | None = None
        last: worker_pb2.WorkerStats | None = None
        try:
            first = True
            while True:
                if not first:  # the first beat goes at once: the router has the worker's
                    await asyncio.sleep(interval)  # load and step costs from the start
                first = False
                if reading is None:
                    reading = asyncio.ensure_future(self._stats_proto())
                # the first beat waits for its stats; later ones go out on time with the last
                await asyncio.wait({reading}, timeout=None if last is None else interval / 2)
                if reading.done():
                    last, reading = reading.result(), None
                else:
                    self.stale_beats += 1
                beat = worker_pb2.HeartbeatRequest(worker_id=worker_id, stats=last)
                ack = await stub.Heartbeat(beat, timeout=self.config.rpc_timeout_s)
                self.heartbeats += 1
                if not ack.known:
                    log.warning("router %s forgot %s: registering again", self.config.router,
                                worker_id)
                    return
        finally:
            if reading is not None:
                reading.cancel()

    async def _stats_proto(self) -> worker_pb2.WorkerStats:
        return status_to_proto(await self._status())
