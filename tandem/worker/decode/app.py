"""The decode role as a process: engine + KV receiver + DecodeService (see ``tandem.worker.process``)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import grpc

from tandem.engine.async_engine import AsyncEngine
from tandem.engine.model_runner import ModelRunner
from tandem.engine.omp_pools import intra_op_threads, release_this_threads_pool
from tandem.kv_transfer import Receiver, ReceiverConfig
from tandem.worker.app import WorkerAppShell, attach_step_log, load_engine
from tandem.worker.config import StartupError, WorkerConfig
from tandem.worker.convert import kv_layout
from tandem.worker.core_lending import BorrowedThreads, CoreBorrower
from tandem.worker.decode import servicer
from tandem.worker.decode.service import DecodeConfig, DecodeWorker
from tandem.worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DecodeAppConfig:
    """Everything a decode worker process is started with."""

    worker: WorkerConfig
    kv_port: int = 0  # KV receiver TCP port (0: a free one)
    kv_host: str | None = None  # KV listen address (None: the gRPC host)
    default_lease_s: float = 30.0  # a reservation's lease when Reserve does not say


class DecodeApp(WorkerAppShell):
    """A started ``DecodeWorker``: the shell plus the receiver's endpoint."""

    role = "decode"
    service_name = servicer.SERVICE_NAME

    def __init__(self, worker: DecodeWorker, receiver: Receiver) -> None:
        super().__init__(worker)
        self.receiver = receiver

    def add_to_server(self, server: grpc.aio.Server) -> None:
        """Register the DecodeService servicer."""
        assert isinstance(self.worker, DecodeWorker)
        servicer.add_to_server(self.worker, server)

    def ready_info(self) -> dict[str, str]:
        """The KV receiver's TCP address for the READY line."""
        return {"kv": self.receiver.endpoint.address("tcp") or ""}

    def kv_endpoint(self) -> str:
        """Every transport the receiver listens on."""
        return self.receiver.endpoint.encode()


async def build_decode_app(config: DecodeAppConfig) -> DecodeApp:
    """Load the engine, start the KV receiver on ``kv_port`` and the worker logic."""
    wc = config.worker
    engine = load_engine(wc.engine, wc.warmup)
    attach_step_log(engine, wc.step_log)
    lent = borrow_cores(engine.runner, wc.core_share, wc.core_share_min_rows) \
        if wc.core_share else None
    metrics = WorkerMetrics("decode", model_name=wc.model_name, compat=wc.metrics_compat)
    if lent is not None:
        metrics.borrowed_steps = lambda: lent.borrowed_steps
    release_this_threads_pool()  # the engine thread's OpenMP pool is to be the only one
    ae = AsyncEngine(engine, on_step=metrics.observe_step)
    layout = kv_layout(engine.remote.kv_cache_spec())
    receiver = Receiver(engine.remote.kv_cache, layout, ReceiverConfig(
        secret=wc.kv_secret, host=config.kv_host or wc.serve.host, port=config.kv_port,
        enable_shm=wc.kv_shm, tls=wc.kv_tls))
    try:
        await receiver.start()
    except OSError as exc:
        await ae.shutdown()
        raise StartupError(f"cannot listen for KV on port {config.kv_port}: {exc}") from exc
    worker = DecodeWorker(ae, receiver, DecodeConfig(
        worker_id=wc.resolved_worker_id("decode"), default_lease_s=config.default_lease_s),
        metrics)
    await worker.start()
    return DecodeApp(worker, receiver)


def borrow_cores(runner: ModelRunner, path: str, min_rows: int) -> BorrowedThreads | None:
    """Let ``runner``'s fused steps of ``min_rows`` rows or more run on every core of this
    process while the prefill worker sharing ``path`` is idle (tandem/worker/core_lending.py); the
    rule it installed (None without the fused forward). StartupError when the file cannot be
    read."""
    own, every = intra_op_threads(), len(os.sched_getaffinity(0))
    try:
        policy = BorrowedThreads(CoreBorrower(path), own=own, borrowed=max(every, own),
                                 min_rows=min_rows)
    except ValueError as exc:
        raise StartupError(str(exc)) from exc
    if runner.fused is None:
        log.warning("--core-share has no effect: the fused native forward is off")
        return None
    runner.step_threads = policy
    log.info("borrowing %d threads (own %d) for steps of >= %d rows while the prefill worker "
             "is idle", policy.borrowed, own, min_rows)
    return policy
