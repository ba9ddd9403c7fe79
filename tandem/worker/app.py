"""The app shell both roles stand on: what ``process.serve`` drives, over a role's logic.

    serve ──add_to_server──> the role's servicer (the only role-specific step)
          ──registration / status──> the router (Register, Heartbeat; protos made by the
                                     registration client)
          ──refresh_metrics──> /metrics        ──begin_drain / wait_idle / close──> shutdown

A role subclasses ``WorkerAppShell`` and fills in its servicer, its role name and what its
READY line and registration add (the decode role's KV endpoint). The role's logic object
(``PrefillWorker``, ``DecodeWorker``) satisfies ``RoleWorker``.
"""

from __future__ import annotations

import logging
from typing import ClassVar, Protocol

import grpc

from tandem.engine.config import EngineConfig
from tandem.engine.errors import ModelLoadError
from tandem.engine.llm_engine import LLMEngine
from tandem.engine.outputs import EngineStats
from tandem.engine.warmup import warm_up
from tandem.kv_transfer import KvLayout
from tandem.worker.config import StartupError
from tandem.worker.metrics import TransferTotals, WorkerMetrics
from tandem.worker.reports import Registration, WorkerStatus
from tandem.worker.step_log import StepLog

log = logging.getLogger(__name__)


class FlipRefused(Exception):
    """A role flip this worker will not make (the reason is the message)."""


class WorkerApp(Protocol):
    """What ``serve`` needs from a worker role."""

    role: str  # "prefill" | "decode"
    service_name: str  # the full gRPC service name, for health and reflection
    metrics: WorkerMetrics  # what /metrics renders, after ``refresh_metrics``

    def add_to_server(self, server: grpc.aio.Server) -> None: ...
    def ready_info(self) -> dict[str, str]: ...
    def registration(self, endpoint: str) -> Registration: ...
    async def status(self) -> WorkerStatus: ...
    async def refresh_metrics(self) -> None: ...
    def begin_drain(self) -> None: ...
    async def wait_idle(self) -> None: ...
    async def close(self) -> None: ...
    async def flip(self, to: str) -> float: ...


class RoleConfig(Protocol):
    """The part of a role's config the shell reads."""

    @property
    def worker_id(self) -> str: ...


class RoleWorker(Protocol):
    """What a role's logic exposes to the shell and to its servicer's Stats."""

    @property
    def config(self) -> RoleConfig: ...
    @property
    def layout(self) -> KvLayout: ...
    @property
    def metrics(self) -> WorkerMetrics: ...
    @property
    def draining(self) -> bool: ...

    async def stats(self) -> EngineStats: ...
    def transfer_totals(self) -> TransferTotals: ...
    def begin_drain(self) -> None: ...
    async def wait_idle(self) -> None: ...
    async def retire(self) -> None: ...
    async def close(self) -> None: ...


async def worker_status(worker: RoleWorker, role: str) -> WorkerStatus:
    """The role's load as the router and ``tandem top`` see it (Heartbeat and Stats)."""
    return WorkerStatus(role, worker.config.worker_id, await worker.stats(), worker.draining,
                        worker.transfer_totals(), worker.metrics.recent())


def load_engine(config: EngineConfig, warmup: bool = True,
                follower_module: str | None = None) -> LLMEngine:
    """Load the model and, unless ``warmup`` is False, warm it up (tandem/engine/warmup.py: its
    first-call costs paid and a step-cost fit in place before the first request); a missing
    or unreadable checkpoint, or a warm-up that fails, is a StartupError. ``follower_module``:
    what ranks 1..N-1 of a tensor-parallel group run (tandem/worker/tp_group.py)."""
    try:
        engine = LLMEngine(config, progress=False, follower_module=follower_module)
    except (ModelLoadError, OSError, ValueError) as exc:
        raise StartupError(f"cannot load model {config.model.model!r}: {exc}") from exc
    if warmup:
        try:
            report = warm_up(engine)
        except Exception as exc:  # an engine that cannot run a step must not start serving
            engine.close()
            raise StartupError(f"the start-up warm-up failed (--skip-warmup skips it): "
                               f"{type(exc).__name__}: {exc}") from exc
        log.info("%s", report.describe())
    return engine


def attach_step_log(engine: LLMEngine, path: str | None) -> StepLog | None:
    """Log ``engine``'s steps to ``path`` (``--step-log``); None (no log) when ``path`` is None
    or empty. Raises StartupError when the file cannot be opened."""
    if not path:
        return None
    try:
        log = StepLog(path)
    except OSError as exc:
        raise StartupError(f"cannot open --step-log {path}: {exc}") from exc
    engine.step_costs.observer = log.record
    return log


class WorkerAppShell:
    """A started role plus what the process runtime needs from it (see the module docstring)."""

    role: ClassVar[str]  # "prefill" | "decode"
    service_name: ClassVar[str]

    def __init__(self, worker: RoleWorker) -> None:
        self.worker = worker
        self.metrics: WorkerMetrics = worker.metrics
        # why ``flip`` refuses: a role's worker alone serves that role only
        self.flip_refusal = (f"this worker serves {self.role} only: a worker that can flip "
                             "is started with python -m tandem.worker.dual")

    def servicer(self) -> object:
        """The role's gRPC servicer over its worker (a new one per call)."""
        raise NotImplementedError

    def add_to_server(self, server: grpc.aio.Server) -> None:
        """Register the role's servicer."""
        raise NotImplementedError

    def ready_info(self) -> dict[str, str]:
        """What the READY line says beyond the gRPC address."""
        return {}

    def kv_endpoint(self) -> str:
        """Where peers push KV to this worker ("" for a role that receives none)."""
        return ""

    def registration(self, endpoint: str) -> Registration:
        """How this worker introduces itself to a router (``endpoint``: its gRPC address)."""
        return Registration(self.role, self.worker.config.worker_id, endpoint,
                            self.worker.layout, self.kv_endpoint())

    async def status(self) -> WorkerStatus:
        """Its load, for heartbeats."""
        return await worker_status(self.worker, self.role)

    async def refresh_metrics(self) -> None:
        """Snapshot the engine and the transfers for the next /metrics scrape."""
        self.metrics.update(await self.worker.stats(), self.worker.transfer_totals())

    def begin_drain(self) -> None:
        """Refuse new work."""
        self.worker.begin_drain()

    async def wait_idle(self) -> None:
        """Until nothing is in progress."""
        await self.worker.wait_idle()

    async def retire(self) -> None:
        """Abort leftovers and stop the transfer side; the engine goes on (a role flip)."""
        await self.worker.retire()

    async def close(self) -> None:
        """Abort leftovers; stop the transfer side and the engine."""
        await self.worker.close()

    async def flip(self, to: str) -> float:
        """A role's worker alone cannot flip (tandem/worker/dual/ serves both roles)."""
        raise FlipRefused(self.flip_refusal)
