"""Assembles the router: registry, policies, admission, services, health and reflection.

Lifecycle: ``start()`` binds and serves; ``drain()`` = ``stop_accepting()`` (health
NOT_SERVING, new requests UNAVAILABLE) then waits for in-flight ones; ``stop()`` closes all.

gRPC health: the overall status ("") and ``tandem.v1.Tandem`` follow readiness (SERVING
only while the router can serve a request now: tandem/router/readiness.py, as HTTP /health),
republished on every registry change; ``tandem.v1.Registry`` is SERVING until the drain
(workers must be able to join a router that is not ready yet); ``liveness`` is SERVING for
as long as the process runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from tandem.common.grpc_keepalive import SERVER_OPTIONS
from tandem.common.security.grpc_auth import (
    ROUTER_AUDIENCE,
    ClusterAuthInterceptor,
    aio_interceptors,
)
from tandem.placement.affinity import PrefixAffinity
from tandem.placement.link import LinkEstimates, LinkPrior
from tandem.placement.log import PlacementLog
from tandem.placement.worker_view import Role
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc, worker_pb2, worker_pb2_grpc
from tandem.router.admin import SERVICE_NAME as ADMIN_SERVICE
from tandem.router.admin import RouterAdminServicer
from tandem.router.admission import AdmissionGate, AdmissionLedger
from tandem.router.auth import AuthInterceptor
from tandem.router.client_limits import ClientLimits
from tandem.router.config import RouterConfig
from tandem.router.cost import NOTHING
from tandem.router.frontend import Frontend
from tandem.router.handoff.counters import HandoffCounters
from tandem.router.handoff.deps import HandoffDeps
from tandem.router.handoff.held_blocks import HeldBlocks
from tandem.router.handoff.inflight import InflightCalls
from tandem.router.http import HttpServer
from tandem.router.membership.health_monitor import HealthMonitor
from tandem.router.membership.registry import Registry
from tandem.router.membership.registry_service import RegistryServicer
from tandem.router.membership.worker_clients import WorkerClients
from tandem.router.metrics import RouterMetrics
from tandem.router.readiness import LIVENESS_SERVICE, Readiness
from tandem.router.security import RouterSecurity
from tandem.router.servicer import TandemServicer
from tandem.router.tokenizer import RouterTokenizer

log = logging.getLogger(__name__)

_SERVICES = (
    tandem_pb2.DESCRIPTOR.services_by_name["Tandem"].full_name,
    worker_pb2.DESCRIPTOR.services_by_name["Registry"].full_name,
    ADMIN_SERVICE,
)


class BindError(RuntimeError):
    """The router's address could not be bound (port busy or host invalid)."""


class RouterServer:
    """One router process's gRPC server and everything behind it."""

    def __init__(
        self,
        config: RouterConfig,
        tokenizer: RouterTokenizer,
        security: RouterSecurity | None = None,
    ) -> None:
        self.config = config
        # Keys and TLS files are read here unless the caller (the CLI) already did.
        self.security = security or RouterSecurity.from_config(config)
        worker_tls = self.security.worker_tls
        self.registry = Registry(
            time.monotonic, config.heartbeat_interval_s, config.missed_heartbeats
        )
        for endpoint in config.prefill_endpoints:
            self.registry.add_static(Role.PREFILL, endpoint)
        for endpoint in config.decode_endpoints:
            self.registry.add_static(Role.DECODE, endpoint)
        credential = self.security.credential
        self.clients = WorkerClients(worker_tls.channel_credentials() if worker_tls else None,
                                     lambda endpoint: aio_interceptors(credential, endpoint))
        affinity = PrefixAffinity(config.affinity_entries)
        self.affinity = affinity  # k8s discovery forgets departed workers here too
        counters = HandoffCounters()
        # Worker calls in flight by endpoint: the health monitor cuts those of a worker it
        # cannot reach (membership sees the tracker only through its CutsCalls protocol).
        self.inflight = InflightCalls()
        # Prompt blocks this router just placed on a worker, until its reports catch up.
        held = HeldBlocks(time.monotonic,
                          2 * config.heartbeat_interval_s + config.health_interval_s)
        self.placement_log = PlacementLog(config.placement_log) if config.placement_log \
            else None
        self.deps = HandoffDeps(config, self.registry, self.clients, affinity, counters,
                                self.inflight, held=held, placement_log=self.placement_log,
                                links=LinkEstimates(LinkPrior(config.link_prior_gbps,
                                                              config.link_prior_rtt_s)))
        deps = self.deps
        budget = config.admission_budget
        self.gate = AdmissionGate(AdmissionLedger(
            budget.sequences, config.max_queue, config.retry_after_ms, budget.tokens))
        # Its own Prometheus registry (``self.metrics.registry``), served at HTTP /metrics.
        self.metrics = RouterMetrics(counters, self.gate.ledger, self.registry,
                                     config.model_name, config.metrics_compat)
        clients = ClientLimits(  # keys count only where API keys say who a client is
            config.connection_budget,
            config.key_budget if self.security.keys is not None else NOTHING,
            config.retry_after_ms,
        )
        self.frontend = Frontend(deps, tokenizer, self.gate, self.metrics, clients)
        self.readiness = Readiness(self.registry, self.gate, config.expects_prefill)
        self._health_changed = asyncio.Event()
        self.registry.watch(self._health_changed.set)
        self._health_task: asyncio.Task[None] | None = None
        self._was_ready: bool | None = None
        self.servicer = TandemServicer(self.frontend)
        self.http: HttpServer | None = None
        self.http_port = 0
        self.monitor = HealthMonitor(
            self.registry, self.clients, affinity, config.health_interval_s,
            config.health_timeout_s, self.inflight,
        )
        self._health = health.aio.HealthServicer()
        self._server: grpc.aio.Server | None = None
        self._stop_monitor = asyncio.Event()
        self._monitor_task: asyncio.Task[None] | None = None
        self.port = 0

    async def start(self) -> int:
        """Bind, serve, start probing workers; returns the bound port."""
        # No SO_REUSEPORT: a second router on a busy port must fail, not share it silently.
        keys, tls = self.security.keys, self.security.server_tls
        # Membership is proven: Registry and RouterAdmin calls need the cluster credential,
        # the public Tandem service needs an API key when keys are configured.
        interceptors: list[grpc.aio.ServerInterceptor] = [
            ClusterAuthInterceptor(self.security.credential, (ROUTER_AUDIENCE,),
                                   protected=_SERVICES[1:])
        ]
        if keys is not None:
            interceptors.append(AuthInterceptor(keys, _SERVICES[:1]))
        # Keepalive (tandem/common/grpc_keepalive.py): the workers' Registry channels and clients
        # may ping every 10 s; the router pings back, so a vanished client frees its slot.
        server = grpc.aio.server(interceptors=interceptors, options=[
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", self.config.max_request_bytes),
            *SERVER_OPTIONS,
        ])
        tandem_pb2_grpc.add_TandemServicer_to_server(self.servicer, server)
        worker_pb2_grpc.add_RegistryServicer_to_server(RegistryServicer(self.registry), server)
        worker_pb2_grpc.add_RouterAdminServicer_to_server(RouterAdminServicer(self.deps), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection((*_SERVICES, reflection.SERVICE_NAME), server)
        address = f"{self.config.host}:{self.config.port}"
        try:
            if tls is None:
                port = server.add_insecure_port(address)
            else:
                port = server.add_secure_port(address, tls.grpc_credentials())
        except RuntimeError as err:
            raise BindError(f"cannot bind {address}: {err}") from err
        if port == 0:
            raise BindError(f"cannot bind {address}")
        await server.start()
        self._server, self.port = server, port
        if self.config.http_enabled:
            await self._start_http()
        # One probe round before the router says it is up: a request sent at once then finds
        # the workers' loads and step costs (placement has no signal without them). Bounded by
        # the probe timeouts; a worker that is not up yet is probed again next round.
        await self.monitor.probe_all()
        await self._publish_health()
        self._health_task = asyncio.create_task(self._follow_readiness())
        self._monitor_task = asyncio.create_task(self.monitor.run(self._stop_monitor,
                                                                  probed=True))
        return port

    async def _follow_readiness(self) -> None:
        """Republish the health statuses after every registry change."""
        while True:
            await self._health_changed.wait()
            self._health_changed.clear()
            await self._publish_health()

    async def _publish_health(self) -> None:
        """Set every gRPC health status from the router's state now (see the docstring)."""
        serving = health_pb2.HealthCheckResponse.SERVING
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        reason = self.readiness.reason()
        if (reason is None) != self._was_ready:
            self._was_ready = reason is None
            if reason is None:
                log.info("ready: %d decode workers routable",
                         len(self.registry.routable(Role.DECODE)))
            else:
                log.warning("not ready: %s", reason)
        tandem, registry, _ = _SERVICES
        for service in ("", tandem):
            await self._health.set(service, serving if reason is None else not_serving)
        await self._health.set(registry, not_serving if self.gate.closed else serving)
        await self._health.set(LIVENESS_SERVICE, serving)

    async def _start_http(self) -> None:
        """The OpenAI-compatible HTTP API on ``http_host:http_port``, sharing this loop."""
        tls = self.security.server_tls
        http = HttpServer(self.frontend, self.metrics.registry, self.security.keys,
                          tls.ssl_context() if tls is not None else None,
                          metrics_keys=self.security.metrics_keys, readiness=self.readiness,
                          admin_keys=self.security.admin_keys)
        host = self.config.http_host or self.config.host
        try:
            self.http_port = await http.start(host, self.config.http_port)
        except OSError as err:
            if self._server is not None:  # do not leave the gRPC port half-started
                await self._server.stop(None)
                self._server = None
            raise BindError(f"cannot bind HTTP {host}:{self.config.http_port}: {err}") from err
        self.http = http

    async def stop_accepting(self) -> None:
        """Health NOT_SERVING and refuse new requests (UNAVAILABLE); in-flight ones go on."""
        self.gate.close()
        await self._publish_health()

    async def drain(self) -> bool:
        """Stop taking requests and wait for in-flight ones; False if the timeout cut it."""
        await self.stop_accepting()
        try:
            await asyncio.wait_for(self.gate.wait_idle(), self.config.drain_timeout_s)
        except asyncio.TimeoutError:
            log.warning("drain timed out with requests still in flight")
            return False
        return True

    async def stop(self, grace_s: float | None = 1.0) -> None:
        """Close the server, the monitor and every worker channel."""
        self._stop_monitor.set()
        for task in (self._monitor_task, self._health_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.http is not None:
            await self.http.stop()
        if self._server is not None:
            await self._server.stop(grace_s)
        await self.clients.close()
        self.frontend.close()
        if self.placement_log is not None:
            self.placement_log.close()
