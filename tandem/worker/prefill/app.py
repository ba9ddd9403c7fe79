"""The prefill role as a process: engine + KV sender + PrefillService (see ``tandem.worker.process``)."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from tandem.engine.async_engine import AsyncEngine
from tandem.kv_transfer import Sender, SenderConfig
from tandem.worker import lora_admin
from tandem.worker.app import WorkerAppShell, attach_step_log, load_engine
from tandem.worker.commit_hold import CommitHold
from tandem.worker.config import StartupError, WorkerConfig
from tandem.worker.convert import kv_group
from tandem.worker.core_lending import CoreLender
from tandem.worker.prefill import servicer
from tandem.worker.prefill.metrics import PrefillMetrics
from tandem.worker.prefill.service import PrefillConfig, PrefillWorker
from tandem.worker.tp_group import FOLLOWER_MODULE, GroupAgents, agent_settings


@dataclass(frozen=True, slots=True)
class PrefillAppConfig:
    """Everything a prefill worker process is started with."""

    worker: WorkerConfig
    transfer_timeout_s: float = 30.0  # from Prefill arrival to the COMMIT's ACK


class PrefillApp(WorkerAppShell):
    """A started ``PrefillWorker``: the shell, nothing to add (it receives no KV)."""

    role = "prefill"
    service_name = servicer.SERVICE_NAME

    def servicer(self) -> servicer.PrefillServicer:
        """The PrefillService servicer over this worker."""
        assert isinstance(self.worker, PrefillWorker)
        return servicer.PrefillServicer(self.worker)

    def add_to_server(self, server: grpc.aio.Server) -> None:
        """Register the PrefillService servicer."""
        assert isinstance(self.worker, PrefillWorker)
        servicer.add_to_server(self.worker, server)
        lora_admin.add_to_server(self.worker.engine, server)


async def build_prefill_app(config: PrefillAppConfig) -> PrefillApp:
    """Load the engine, make the KV sender, install the layer hook."""
    wc = config.worker
    engine = load_engine(wc.engine, wc.warmup, FOLLOWER_MODULE)
    attach_step_log(engine, wc.step_log)
    metrics = PrefillMetrics(model_name=wc.model_name, compat=wc.metrics_compat)
    try:  # lend this host's cores to its decode worker while idle (tandem/worker/core_lending.py)
        lender = CoreLender(wc.core_share) if wc.core_share else None
    except ValueError as exc:
        raise StartupError(str(exc)) from exc
    ae = AsyncEngine(engine, on_step=metrics.observe_step,
                     on_busy=lender.set_busy if lender is not None else None)
    return await start_prefill_app(ae, config, metrics)


async def start_prefill_app(ae: AsyncEngine, config: PrefillAppConfig,
                            metrics: PrefillMetrics) -> PrefillApp:
    """The prefill role over a loaded, running engine: its KV sender, the layer hook, the
    worker logic (a role flip calls this too)."""
    wc = config.worker
    engine = ae.engine
    group = kv_group(engine.remote.kv_cache_spec())
    sender = Sender(engine.remote.kv_cache, group.layout,
                    SenderConfig(secret=wc.kv_secret, prefer_shm=wc.kv_shm, tls=wc.kv_tls,
                                 codec=wc.kv_codec, stripes=wc.kv_stripes or 1),
                    group=group, rank=0)
    agents = None
    if engine.group is not None:  # ranks 1..N-1 push their own KV heads
        agents = GroupAgents(engine.group.agents())
        try:
            await agents.start(agent_settings("prefill", wc, group))
        except Exception as exc:
            await ae.shutdown()
            raise StartupError(f"cannot start the group's KV endpoints: {exc}") from exc
    worker = PrefillWorker(ae, sender, PrefillConfig(
        worker_id=wc.resolved_worker_id("prefill"),
        transfer_timeout_s=config.transfer_timeout_s), metrics, CommitHold.from_env(), agents)
    await worker.start()
    return PrefillApp(worker)
