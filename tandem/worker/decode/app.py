"""The decode role as a process: engine + KV receiver + DecodeService (see ``tandem.worker.process``)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import grpc

from tandem.engine.async_engine import AsyncEngine
from tandem.engine.model_runner import ModelRunner
from tandem.engine.omp_pools import intra_op_threads, release_this_threads_pool
from tandem.engine.step_threads import AdaptiveThreads, LeasedThreads
from tandem.kv_transfer import Endpoint, Receiver, ReceiverConfig, Sender, SenderConfig
from tandem.kv_transfer.group_endpoint import GroupEndpoint
from tandem.worker import lora_admin
from tandem.worker.app import WorkerAppShell, attach_step_log, load_engine
from tandem.worker.commit_hold import CommitHold
from tandem.worker.config import StartupError, WorkerConfig
from tandem.worker.convert import kv_group
from tandem.worker.core_lending import CoreBorrower
from tandem.worker.decode import servicer
from tandem.worker.decode.service import DecodeConfig, DecodeWorker
from tandem.worker.metrics import WorkerMetrics
from tandem.worker.step_hold import StepHold
from tandem.worker.tp_group import FOLLOWER_MODULE, GroupAgents, agent_settings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DecodeAppConfig:
    """Everything a decode worker process is started with."""

    worker: WorkerConfig
    kv_port: int = 0  # KV receiver TCP port (0: a free one)
    kv_host: str | None = None  # KV listen address (None: the gRPC host)
    # The host prefill workers are told to dial, on kv_port (None: the listen address): a
    # worker behind NAT, a Service or a proxy is reached at another address than it binds.
    kv_advertise_host: str | None = None
    default_lease_s: float = 30.0  # a reservation's lease when Reserve does not say


class DecodeApp(WorkerAppShell):
    """A started ``DecodeWorker``: the shell plus the receiver's endpoint."""

    role = "decode"
    service_name = servicer.SERVICE_NAME

    def __init__(self, worker: DecodeWorker, receiver: Receiver) -> None:
        super().__init__(worker)
        self.receiver = receiver

    def servicer(self) -> servicer.DecodeServicer:
        """The DecodeService servicer over this worker."""
        assert isinstance(self.worker, DecodeWorker)
        return servicer.DecodeServicer(self.worker)

    def add_to_server(self, server: grpc.aio.Server) -> None:
        """Register the DecodeService servicer."""
        assert isinstance(self.worker, DecodeWorker)
        servicer.add_to_server(self.worker, server)
        lora_admin.add_to_server(self.worker.engine, server)

    def ready_info(self) -> dict[str, str]:
        """The KV receiver's TCP address for the READY line."""
        return {"kv": self.receiver.endpoint.address("tcp") or ""}

    def kv_endpoint(self) -> str:
        """Every transport the receiver listens on (a group's: every rank's)."""
        assert isinstance(self.worker, DecodeWorker)
        return self.worker.kv_endpoint


async def build_decode_app(config: DecodeAppConfig) -> DecodeApp:
    """Load the engine, start the KV receiver on ``kv_port`` and the worker logic."""
    wc = config.worker
    engine = load_engine(wc.engine, wc.warmup, FOLLOWER_MODULE)
    attach_step_log(engine, wc.step_log)
    rule = choose_step_threads(engine.runner, wc.core_share, wc.adaptive_threads)
    metrics = WorkerMetrics("decode", model_name=wc.model_name, compat=wc.metrics_compat)
    if rule is not None and wc.core_share:
        metrics.borrowed_steps = lambda: rule.wide_steps
    release_this_threads_pool()  # the engine thread's OpenMP pool is to be the only one
    hold = StepHold.from_env()  # test-only; None in every deployment
    ae = AsyncEngine(engine, on_step=metrics.observe_step,
                     pause=hold.paused if hold is not None else None)
    try:
        return await start_decode_app(ae, config, metrics)
    except StartupError:
        await ae.shutdown()
        raise


async def start_decode_app(ae: AsyncEngine, config: DecodeAppConfig,
                           metrics: WorkerMetrics) -> DecodeApp:
    """The decode role over a loaded, running engine: its KV receiver started on
    ``kv_port``, its live-move sender, the worker logic (a role flip calls this too)."""
    wc = config.worker
    engine = ae.engine
    group = kv_group(engine.remote.kv_cache_spec())
    receiver = Receiver(engine.remote.kv_cache, group.layout, ReceiverConfig(
        secret=wc.kv_secret, host=config.kv_host or wc.serve.host, port=config.kv_port,
        advertise_host=config.kv_advertise_host, enable_shm=wc.kv_shm, tls=wc.kv_tls,
        codecs=() if wc.kv_codec == "raw" else (wc.kv_codec,),
        **({"max_stripes": wc.kv_stripes} if wc.kv_stripes else {})), group=group, rank=0)
    try:
        await receiver.start()
    except OSError as exc:
        raise StartupError(f"cannot listen for KV on port {config.kv_port}: {exc}") from exc
    agents, kv_endpoint, sender = None, None, None
    if engine.group is not None:  # ranks 1..N-1 take the KV of their own heads
        agents = GroupAgents(engine.group.agents())
        try:
            ranks = await agents.start(agent_settings(
                "decode", wc, group, config.kv_host or wc.serve.host, config.kv_advertise_host))
            kv_endpoint = GroupEndpoint(group, (receiver.endpoint, *map(Endpoint.decode, ranks))
                                        ).encode()
        except Exception as exc:
            await receiver.close()
            raise StartupError(f"cannot start the group's KV endpoints: {exc}") from exc
    else:
        # A live move pushes a stream's KV from here to another decode worker (moves.py); a
        # group's streams do not move live (each rank holds only its heads).
        sender = Sender(engine.remote.kv_cache, group.layout,
                        SenderConfig(secret=wc.kv_secret, prefer_shm=wc.kv_shm, tls=wc.kv_tls,
                                     codec=wc.kv_codec, stripes=wc.kv_stripes or 1))
    worker = DecodeWorker(ae, receiver, DecodeConfig(
        worker_id=wc.resolved_worker_id("decode"), default_lease_s=config.default_lease_s),
        metrics, sender=sender, hold=CommitHold.from_env(), agents=agents,
        kv_endpoint=kv_endpoint)
    await worker.start()
    return DecodeApp(worker, receiver)


def choose_step_threads(runner: ModelRunner, core_share: str | None,
                        adaptive: bool) -> AdaptiveThreads | LeasedThreads | None:
    """How ``runner``'s fused steps pick their threads (tandem/engine/step_threads.py): with a
    host's core-share file, its own threads or, under a lease on the idle prefill worker's
    cores, every core of this process (tandem/worker/core_lending.py); else, when ``adaptive``,
    half or all of its own threads. Each step runs on whichever measures faster for its size
    (not ``adaptive``: with a core share, wide whenever the lease is granted).
    None: every step on the worker's threads. StartupError when the file cannot be read."""
    if runner.fused is None:
        if core_share:
            log.warning("--core-share has no effect: the fused native forward is off")
        return None
    if core_share:
        try:
            lease = CoreBorrower(core_share)
        except ValueError as exc:
            raise StartupError(str(exc)) from exc
        rule = runner.adapt_threads(len(os.sched_getaffinity(0)), lease, measure=adaptive)
    elif adaptive:
        rule = runner.adapt_threads(intra_op_threads())
    else:
        return None
    if rule is not None:
        log.info("steps run on %d or %d threads, %s%s", *rule.sizes,
                 "whichever measures faster" if adaptive else "the wider whenever lent",
                 " (the wider under a lease on the prefill worker's idle cores)"
                 if core_share else "")
    return rule
