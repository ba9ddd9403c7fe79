"""A worker process: serve, announce, register, drain. Shared with ``prefill_worker``.

    bind the gRPC port (fail fast when busy) ──> build the app (engine, KV endpoint)
    ──> [serve /metrics on --metrics-port] ──> start: the service + grpc.health.v1
    + reflection ──> print TANDEM_READY {...} (with "metrics": "host:port" when served)
    ──> [register with the router and heartbeat]
    SIGTERM/SIGINT ──> health NOT_SERVING, new work refused ("draining"), running work
    finishes (bounded by drain_timeout_s) ──> stop the server ──> close the app ──> exit 0
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TextIO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from decode_worker.metrics import WorkerMetrics
from decode_worker.metrics_http import MetricsBindError, MetricsServer
from decode_worker.registration import RegistrationConfig, RegistryClient
from decode_worker.tls import ServerTls
from engine.config import EngineConfig
from engine.errors import ModelLoadError
from engine.llm_engine import LLMEngine
from protos.tandem.v1 import worker_pb2

log = logging.getLogger(__name__)

READY_MARKER = "TANDEM_READY"
# Used when no --kv-secret-file is given: fine for one machine, never for a shared network.
DEV_KV_SECRET = b"tandem-dev-kv-secret-do-not-use-in-production"


class StartupError(Exception):
    """The worker cannot start (busy port, bad flag value, unreadable secret)."""


class WorkerApp(Protocol):
    """What ``serve`` needs from a worker role."""

    role: str  # "prefill" | "decode"
    service_name: str  # the full gRPC service name, for health and reflection
    metrics: WorkerMetrics  # what /metrics renders, after ``refresh_metrics``

    def add_to_server(self, server: grpc.aio.Server) -> None: ...
    def ready_info(self) -> dict[str, str]: ...
    def register_request(self, endpoint: str) -> worker_pb2.RegisterRequest: ...
    async def stats_proto(self) -> worker_pb2.WorkerStats: ...
    async def refresh_metrics(self) -> None: ...
    def begin_drain(self) -> None: ...
    async def wait_idle(self) -> None: ...
    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """Where to listen and how to stop."""

    host: str = "127.0.0.1"
    port: int = 0
    router: str | None = None
    drain_timeout_s: float = 60.0
    stop_grace_s: float = 5.0
    metrics_port: int = -1  # Prometheus /metrics: -1 off, 0 a free port
    metrics_host: str | None = None  # default: ``host``
    tls: ServerTls | None = None  # TLS (mTLS with a client CA) on the gRPC port
    router_credentials: grpc.ChannelCredentials | None = None  # registering with a TLS router


def load_kv_secret(path: str | None) -> bytes:
    """The KV transfer's shared secret from a file, or the development default (logged)."""
    if path is None:
        log.warning("no --kv-secret-file: using the built-in development KV secret")
        return DEV_KV_SECRET
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as exc:
        raise StartupError(f"cannot read the KV secret file: {exc}") from exc
    if len(secret) < 16:
        raise StartupError(f"the KV secret in {path} must be at least 16 bytes")
    return secret


def load_engine(config: EngineConfig) -> LLMEngine:
    """Load the model; a missing or unreadable checkpoint is a StartupError."""
    try:
        return LLMEngine(config, progress=False)
    except (ModelLoadError, OSError, ValueError) as exc:
        raise StartupError(f"cannot load model {config.model.model!r}: {exc}") from exc


def announce(role: str, grpc_address: str, extra: dict[str, str], out: TextIO) -> None:
    """Print the one READY line launchers and tests wait for."""
    info = {"role": role, "grpc": grpc_address, **extra}
    out.write(f"{READY_MARKER} {json.dumps(info)}\n")
    out.flush()


async def serve(
    config: ServeConfig,
    build: Callable[[], Awaitable[WorkerApp]],
    out: TextIO = sys.stdout,
    stop: asyncio.Event | None = None,
) -> int:
    """Run a worker until SIGTERM/SIGINT, then drain; returns the exit status.

    ``stop``: drain when this event is set instead of on signals (a worker hosted in a Ray
    actor, whose event loop is not on the main thread, cannot install signal handlers)."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    address = f"{config.host}:{config.port}"
    try:
        if config.tls is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, config.tls.credentials())
    except RuntimeError as exc:
        raise StartupError(f"cannot listen on {address}: {exc}") from exc
    if port == 0:
        raise StartupError(f"cannot listen on {address}")
    app = await build()
    metrics = MetricsServer(app.metrics.registry, app.refresh_metrics)
    try:
        extra = await _serve_metrics(config, metrics)
        return await _run(config, server, app, f"{config.host}:{port}", out, stop, extra)
    finally:
        await metrics.stop()
        await server.stop(None)
        await app.close()


async def _serve_metrics(config: ServeConfig, metrics: MetricsServer) -> dict[str, str]:
    """Start /metrics when asked; returns what the READY line says about it."""
    if config.metrics_port < 0:
        return {}
    host = config.metrics_host or config.host
    try:
        port = await metrics.start(host, config.metrics_port)
    except MetricsBindError as exc:
        raise StartupError(str(exc)) from exc
    return {"metrics": f"{host}:{port}"}


async def _run(
    config: ServeConfig,
    server: grpc.aio.Server,
    app: WorkerApp,
    endpoint: str,
    out: TextIO,
    stop: asyncio.Event | None,
    extra: dict[str, str],
) -> int:
    app.add_to_server(server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        [app.service_name, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME],
        server,
    )
    await server.start()
    for name in ("", app.service_name):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    loop = asyncio.get_running_loop()
    if stop is None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    registry: asyncio.Task[None] | None = None
    if config.router:
        registration = RegistrationConfig(config.router, credentials=config.router_credentials)
        client = RegistryClient(registration, lambda: app.register_request(endpoint),
                                app.stats_proto)
        registry = loop.create_task(client.run())
    announce(app.role, endpoint, {**app.ready_info(), **extra}, out)
    log.info("%s worker serving on %s", app.role, endpoint)
    await stop.wait()
    log.info("draining: no new work, finishing what is running")
    app.begin_drain()  # before health says so: a NOT_SERVING worker refuses new work
    await health.enter_graceful_shutdown()
    try:
        await asyncio.wait_for(app.wait_idle(), config.drain_timeout_s)
    except asyncio.TimeoutError:
        log.warning("drain timed out after %.0fs: aborting what is left", config.drain_timeout_s)
    if registry is not None:
        registry.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await registry
    await server.stop(config.stop_grace_s)
    log.info("%s worker stopped", app.role)
    return 0
