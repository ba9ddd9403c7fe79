"""A worker that serves one role at a time over one loaded engine and flips on the
router's word (WorkerControl.Flip):

    serving R ──Flip(to)──> R takes no new work (its gates still answer what is running)
      ──> R's work finishes (a decode worker's streams were moved off by the router first;
          a prefill worker's queued prefills run to their COMMIT and release their leases),
          bounded by the drain timeout, then R retires (leftovers aborted, its transfer side
          closed) ──> the other role starts over the same engine (decode: a fresh KV
          receiver on --kv-port) ──> its gate answers; registration and heartbeats say it

One engine, one KV cache, both roles' metrics (each keeps its counters across flips; /metrics
renders the current role's). A role that fails to start (its KV port taken) puts the old
one back and the flip is refused with the reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass

import grpc
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry

from tandem.engine.async_engine import AsyncEngine
from tandem.engine.omp_pools import release_this_threads_pool
from tandem.protos.v1 import worker_pb2_grpc
from tandem.worker import lora_admin
from tandem.worker.app import FlipRefused, WorkerAppShell, attach_step_log, load_engine
from tandem.worker.config import StartupError, WorkerConfig
from tandem.worker.decode.app import (
    DecodeAppConfig,
    build_decode_app,
    choose_step_threads,
    start_decode_app,
)
from tandem.worker.dual.gate import RoleGate
from tandem.worker.metrics import WorkerMetrics
from tandem.worker.prefill.app import PrefillAppConfig, build_prefill_app, start_prefill_app
from tandem.worker.prefill.metrics import PrefillMetrics
from tandem.worker.reports import Registration, WorkerStatus
from tandem.worker.step_hold import StepHold

log = logging.getLogger(__name__)

ROLES = ("prefill", "decode")


@dataclass(frozen=True, slots=True)
class DualAppConfig:
    """A flippable worker's start: its first role and both roles' configs (one WorkerConfig)."""

    role: str
    decode: DecodeAppConfig
    prefill: PrefillAppConfig

    @property
    def worker(self) -> WorkerConfig:
        """What both roles share (the decode config's: one WorkerConfig)."""
        return self.decode.worker


class _CurrentRegistry:
    """What /metrics renders: the current role's registry (a collector over it)."""

    def __init__(self, app: DualApp) -> None:
        self._app = app

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        return self._app.current.metrics.registry.collect()


class _Metrics:
    """The stable metrics object ``serve`` holds: a registry that follows the role."""

    def __init__(self, app: DualApp) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_CurrentRegistry(app))  # type: ignore[arg-type]


class DualApp:
    """The ``WorkerApp`` of a flippable worker (see the module docstring)."""

    def __init__(self, ae: AsyncEngine, config: DualAppConfig, first: WorkerAppShell,
                 metrics: dict[str, WorkerMetrics]) -> None:
        self._ae = ae
        self._config = config
        self.current: WorkerAppShell = first
        self._role_metrics = metrics
        # the role served and its servicer; None while a flip switches (both gates refuse)
        self._serving: tuple[str, object] | None = (first.role, first.servicer())
        self._flipping = False
        self.metrics = _Metrics(self)

    @property
    def role(self) -> str:
        """The role served now (the new one from the moment a flip starts it)."""
        return self.current.role

    @property
    def service_name(self) -> str:
        """The first role's service (health and reflection list both)."""
        return self.current.service_name

    def add_to_server(self, server: grpc.aio.Server) -> None:
        """Both roles' gated services."""
        worker_pb2_grpc.add_PrefillServiceServicer_to_server(
            RoleGate("PrefillService", "prefill", self._servicer, lambda: self.role), server)
        worker_pb2_grpc.add_DecodeServiceServicer_to_server(
            RoleGate("DecodeService", "decode", self._servicer, lambda: self.role), server)
        lora_admin.add_to_server(self._ae, server)  # the engine's adapters, either role

    def _servicer(self, role: str) -> object | None:
        serving = self._serving
        if serving is None or serving[0] != role:
            return None
        return serving[1]

    def ready_info(self) -> dict[str, str]:
        return {**self.current.ready_info(), "flippable": "1"}

    def registration(self, endpoint: str) -> Registration:
        return self.current.registration(endpoint)

    async def status(self) -> WorkerStatus:
        return await self.current.status()

    async def refresh_metrics(self) -> None:
        await self.current.refresh_metrics()

    def begin_drain(self) -> None:
        self.current.begin_drain()

    async def wait_idle(self) -> None:
        await self.current.wait_idle()

    async def retire(self) -> None:
        await self.current.retire()

    async def close(self) -> None:
        await self.current.close()

    async def flip(self, to: str) -> float:
        """Switch to role ``to`` (see the module docstring); the seconds it took. Raises
        FlipRefused: an unknown role, the role served now, a flip in progress, or the new
        role could not start (the old one serves again)."""
        if to not in ROLES:
            raise FlipRefused(f"no role {to!r}")
        if self._flipping:
            raise FlipRefused("a flip of this worker is in progress")
        if to == self.role:
            raise FlipRefused(f"this worker serves {to} already")
        if self.current.worker.draining:
            raise FlipRefused("this worker is draining")
        if self._config.worker.engine.tensor_parallel_size > 1:  # build_dual_app never makes one
            raise FlipRefused("a tensor-parallel group keeps its role (its ranks' KV endpoints "
                              "serve one role)")
        self._flipping = True
        t0 = time.monotonic()
        old = self.current
        try:
            log.info("flipping from %s to %s", old.role, to)
            old.begin_drain()
            try:
                await asyncio.wait_for(old.wait_idle(),
                                       self._config.decode.worker.serve.drain_timeout_s)
            except asyncio.TimeoutError:
                log.warning("the %s role's work did not end in time: aborting it", old.role)
            self._serving = None
            await old.retire()
            try:
                self.current = await self._start(to)
            except StartupError as exc:
                log.warning("cannot start the %s role (%s): serving %s again", to, exc,
                            old.role)
                self.current = await self._start(old.role)
                raise FlipRefused(f"the {to} role could not start: {exc}") from exc
            finally:
                self._serving = (self.current.role, self.current.servicer())
        finally:
            self._flipping = False
        seconds = time.monotonic() - t0
        log.info("serving %s after a flip of %.3f s", to, seconds)
        return seconds

    async def _start(self, role: str) -> WorkerAppShell:
        if role == "decode":
            metrics = self._role_metrics["decode"]
            return await start_decode_app(self._ae, self._config.decode, metrics)
        prefill_metrics = self._role_metrics["prefill"]
        assert isinstance(prefill_metrics, PrefillMetrics)
        return await start_prefill_app(self._ae, self._config.prefill, prefill_metrics)


async def build_dual_app(config: DualAppConfig) -> DualApp | WorkerAppShell:
    """Load the engine once, start the first role over it.

    A worker given a host's core share (``--core-share``: it lends its idle cores to the
    decode worker beside it, or borrows them) starts as that role's worker alone and refuses
    flips: lender and borrower are the two roles, and a flip would leave both, or neither,
    on the host. A tensor-parallel group does the same: its ranks' KV endpoints are started
    for one role (tandem/worker/tp_group.py)."""
    grouped = config.worker.engine.tensor_parallel_size > 1
    if config.worker.core_share or grouped:
        app: WorkerAppShell = await (build_decode_app(config.decode) if config.role == "decode"
                                     else build_prefill_app(config.prefill))
        app.flip_refusal = (
            "a tensor-parallel group keeps its role (its ranks' KV endpoints serve one role)"
            if grouped else "this worker shares its host's cores with the other role's "
            "worker (--core-share): it keeps its role")
        return app
    wc = config.decode.worker
    worker_id = wc.worker_id or f"worker-{socket.gethostname()}-{os.getpid()}"
    wc = dataclasses.replace(wc, worker_id=worker_id)  # one id across flips
    config = DualAppConfig(config.role, dataclasses.replace(config.decode, worker=wc),
                           dataclasses.replace(config.prefill, worker=wc))
    engine = load_engine(wc.engine, wc.warmup)
    attach_step_log(engine, wc.step_log)
    choose_step_threads(engine.runner, None, wc.adaptive_threads)  # either role's steps
    metrics: dict[str, WorkerMetrics] = {
        "decode": WorkerMetrics("decode", model_name=wc.model_name, compat=wc.metrics_compat),
        "prefill": PrefillMetrics(model_name=wc.model_name, compat=wc.metrics_compat)}
    holder: list[DualApp] = []
    release_this_threads_pool()  # the engine thread's OpenMP pool is to be the only one
    hold = StepHold.from_env()  # test-only, either role's steps; None in every deployment
    ae = AsyncEngine(engine, on_step=lambda s: holder[0].current.metrics.observe_step(s)
                     if holder else None, pause=hold.paused if hold is not None else None)
    app = DualApp(ae, config, await _first(ae, config, metrics), metrics)
    holder.append(app)
    return app


async def _first(ae: AsyncEngine, config: DualAppConfig,
                 metrics: dict[str, WorkerMetrics]) -> WorkerAppShell:
    try:
        if config.role == "decode":
            return await start_decode_app(ae, config.decode, metrics["decode"])
        prefill_metrics = metrics["prefill"]
        assert isinstance(prefill_metrics, PrefillMetrics)
        return await start_prefill_app(ae, config.prefill, prefill_metrics)
    except StartupError:
        await ae.shutdown()
        raise
