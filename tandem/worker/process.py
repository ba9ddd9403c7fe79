"""A worker process, for both roles: serve, announce, register, drain.

    no cluster credential: refuse ──> bind the gRPC port (fail fast when busy; every RPC but
    health needs the credential) ──> build the app (engine, KV endpoint)
    ──> [serve /metrics on --metrics-port] ──> start: the service + Membership (the proof a
    discovering router asks for, tandem/worker/membership.py) + grpc.health.v1 + reflection ──> print TANDEM_READY {...} (with "metrics": "host:port" when served)
    ──> [register with the router and heartbeat]
    SIGTERM/SIGINT, or WorkerControl.Drain from the router (an operator's drain) ──> health NOT_SERVING, new work refused ("draining"), running work
    finishes (bounded by drain_timeout_s) ──> stop the server ──> close the app ──> exit 0
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TextIO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from tandem.common.grpc_keepalive import SERVER_OPTIONS
from tandem.common.security.grpc_auth import ClusterAuthInterceptor, worker_audience
from tandem.common.wire import ready_line
from tandem.protos.v1 import worker_pb2, worker_pb2_grpc
from tandem.worker.app import FlipRefused, WorkerApp
from tandem.worker.config import ServeConfig, StartupError
from tandem.worker.membership import MembershipServicer
from tandem.worker.metrics_http import MetricsBindError, MetricsServer
from tandem.worker.registration import RegistrationConfig, RegistryClient

log = logging.getLogger(__name__)

MEMBERSHIP_SERVICE = worker_pb2.DESCRIPTOR.services_by_name["Membership"].full_name
CONTROL_SERVICE = worker_pb2.DESCRIPTOR.services_by_name["WorkerControl"].full_name
_ROLE_NAMES = {worker_pb2.ROLE_PREFILL: "prefill", worker_pb2.ROLE_DECODE: "decode"}


class ControlServicer(worker_pb2_grpc.WorkerControlServicer):
    """``tandem.v1.WorkerControl``: the router asks this worker to drain (as SIGTERM does)
    or to flip its role (a worker started by tandem/worker/dual/; any other refuses)."""

    def __init__(self, stop: asyncio.Event, app: WorkerApp) -> None:
        self._stop = stop
        self._app = app

    async def Flip(  # noqa: N802 (gRPC method names)
        self, request: worker_pb2.FlipRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.FlipResponse:
        to = _ROLE_NAMES.get(request.to)
        if to is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "to: must be ROLE_PREFILL or ROLE_DECODE")
        assert to is not None
        if self._stop.is_set():
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this worker is draining")
        log.info("flip to %s asked for by the router", to)
        try:  # a flip runs to its end even if the router's call goes away: half done,
            # neither role would serve
            seconds = await asyncio.shield(self._app.flip(to))
        except FlipRefused as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return worker_pb2.FlipResponse(seconds=seconds)

    async def Drain(  # noqa: N802 (gRPC method names)
        self, request: worker_pb2.DrainRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.DrainResponse:
        log.info("drain asked for by the router")
        self._stop.set()
        return worker_pb2.DrainResponse()


def announce(role: str, grpc_address: str, extra: dict[str, str], out: TextIO) -> None:
    """Print the one READY line launchers and tests wait for."""
    out.write(ready_line({"role": role, "grpc": grpc_address, **extra}))
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
    if config.credential is None:
        raise StartupError("no cluster credential: a worker never serves without one "
                           "(--cluster-secret-file, or --insecure on a trusted machine)")
    # Keepalive: accept the router's pings, and ping it, so a stream to a router that went
    # silent (a partition) is cancelled and its KV blocks freed (tandem/common/grpc_keepalive.py).
    # Tokens are minted for one worker: this one answers to its own address (its names are
    # known once the port is bound, before anything is served), and to --advertise-address.
    auth = ClusterAuthInterceptor(config.credential)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0), *SERVER_OPTIONS],
                             interceptors=[auth])
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
    audience = worker_audience(config.host, port) | frozenset(config.advertise)
    auth.answer_to(audience)
    app = await build()
    metrics = MetricsServer(app.metrics.registry, app.refresh_metrics)
    try:
        extra = await _serve_metrics(config, metrics)
        return await _run(config, server, app, f"{config.host}:{port}", out, stop, extra,
                          audience)
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
    audience: frozenset[str],
) -> int:
    app.add_to_server(server)
    assert config.credential is not None  # serve() refuses to start without one
    worker_pb2_grpc.add_MembershipServicer_to_server(
        MembershipServicer(config.credential, lambda: app.role, audience), server)
    if stop is None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    worker_pb2_grpc.add_WorkerControlServicer_to_server(ControlServicer(stop, app), server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        [app.service_name, MEMBERSHIP_SERVICE, CONTROL_SERVICE,
         health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
        server,
    )
    await server.start()
    for name in ("", app.service_name):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    loop = asyncio.get_running_loop()
    registry: asyncio.Task[None] | None = None
    if config.router:
        registration = RegistrationConfig(config.router, credentials=config.router_credentials,
                                          cluster=config.credential)
        client = RegistryClient(registration, lambda: app.registration(endpoint), app.status)
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
