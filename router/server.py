"""Assembles the router: registry, policies, admission, services, health and reflection.

Lifecycle: ``start()`` binds and serves; ``drain()`` = ``stop_accepting()`` (health
NOT_SERVING, new requests UNAVAILABLE) then waits for in-flight ones; ``stop()`` closes all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from protos.tandem.v1 import tandem_pb2, tandem_pb2_grpc, worker_pb2, worker_pb2_grpc
from router.admission import AdmissionGate, AdmissionLedger
from router.affinity import PrefixAffinity
from router.config import RouterConfig
from router.counters import HandoffCounters
from router.frontend import Frontend
from router.handoff import HandoffDeps
from router.health_monitor import HealthMonitor
from router.registry import Registry
from router.registry_service import RegistryServicer
from router.servicer import TandemServicer
from router.tokenizer import RouterTokenizer
from router.worker_clients import WorkerClients
from router.worker_view import Role

log = logging.getLogger(__name__)

_SERVICES = (
    tandem_pb2.DESCRIPTOR.services_by_name["Tandem"].full_name,
    worker_pb2.DESCRIPTOR.services_by_name["Registry"].full_name,
)


class BindError(RuntimeError):
    """The router's address could not be bound (port busy or host invalid)."""


class RouterServer:
    """One router process's gRPC server and everything behind it."""

    def __init__(self, config: RouterConfig, tokenizer: RouterTokenizer) -> None:
        self.config = config
        self.registry = Registry(
            time.monotonic, config.heartbeat_interval_s, config.missed_heartbeats
        )
        for endpoint in config.prefill_endpoints:
            self.registry.add_static(Role.PREFILL, endpoint)
        for endpoint in config.decode_endpoints:
            self.registry.add_static(Role.DECODE, endpoint)
        self.clients = WorkerClients()
        affinity = PrefixAffinity(config.affinity_entries)
        deps = HandoffDeps(config, self.registry, self.clients, affinity, HandoffCounters())
        self.gate = AdmissionGate(
            AdmissionLedger(config.max_inflight, config.max_queue, config.retry_after_ms)
        )
        self.servicer = TandemServicer(Frontend(deps, tokenizer, self.gate))
        self.monitor = HealthMonitor(
            self.registry, self.clients, affinity, config.health_interval_s, config.health_timeout_s
        )
        self._health = health.aio.HealthServicer()
        self._server: grpc.aio.Server | None = None
        self._stop_monitor = asyncio.Event()
        self._monitor_task: asyncio.Task[None] | None = None
        self.port = 0

    async def start(self) -> int:
        """Bind, serve, start probing workers; returns the bound port."""
        # No SO_REUSEPORT: a second router on a busy port must fail, not share it silently.
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        tandem_pb2_grpc.add_TandemServicer_to_server(self.servicer, server)
        worker_pb2_grpc.add_RegistryServicer_to_server(RegistryServicer(self.registry), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection((*_SERVICES, reflection.SERVICE_NAME), server)
        address = f"{self.config.host}:{self.config.port}"
        try:
            port = server.add_insecure_port(address)
        except RuntimeError as err:
            raise BindError(f"cannot bind {address}: {err}") from err
        if port == 0:
            raise BindError(f"cannot bind {address}")
        await server.start()
        self._server, self.port = server, port
        for service in ("", *_SERVICES):
            await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        self._monitor_task = asyncio.create_task(self.monitor.run(self._stop_monitor))
        return port

    async def stop_accepting(self) -> None:
        """Health NOT_SERVING and refuse new requests (UNAVAILABLE); in-flight ones go on."""
        self.gate.close()
        for service in ("", *_SERVICES):
            await self._health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)

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
        if self._monitor_task is not None:
            self._monitor_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor_task
        if self._server is not None:
            await self._server.stop(grace_s)
        await self.clients.close()
