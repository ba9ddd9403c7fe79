"""The prefill role as a process: engine + KV sender + PrefillService (``process.serve``).

Imports the shared process runtime from ``decode_worker`` (``process``, ``convert``): one
definition of serving, draining and registration for both roles.
"""

from __future__ import annotations

import argparse
import os
import socket

import grpc

from decode_worker.convert import kv_layout, layout_to_proto, stats_to_proto
from decode_worker.metrics import WorkerMetrics
from decode_worker.process import load_engine
from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from kv_transfer import Sender, SenderConfig
from prefill_worker.service import PrefillConfig, PrefillWorker
from prefill_worker.servicer import PrefillServicer
from protos.tandem.v1 import worker_pb2, worker_pb2_grpc

SERVICE_NAME = worker_pb2.DESCRIPTOR.services_by_name["PrefillService"].full_name


class PrefillApp:
    """A started ``PrefillWorker`` plus what the process runtime needs from it."""

    role = "prefill"
    service_name = SERVICE_NAME

    def __init__(self, worker: PrefillWorker) -> None:
        self.worker = worker
        self.metrics: WorkerMetrics = worker.metrics

    def add_to_server(self, server: grpc.aio.Server) -> None:
        """Register the PrefillService servicer."""
        worker_pb2_grpc.add_PrefillServiceServicer_to_server(PrefillServicer(self.worker), server)

    def ready_info(self) -> dict[str, str]:
        """Nothing beyond the gRPC address."""
        return {}

    def register_request(self, endpoint: str) -> worker_pb2.RegisterRequest:
        """How this worker introduces itself to a router."""
        return worker_pb2.RegisterRequest(
            role=worker_pb2.ROLE_PREFILL, worker_id=self.worker.config.worker_id,
            endpoint=endpoint, layout=layout_to_proto(self.worker.layout),
        )

    async def stats_proto(self) -> worker_pb2.WorkerStats:
        """Stats for heartbeats."""
        w = self.worker
        return stats_to_proto(await w.stats(), worker_pb2.ROLE_PREFILL, w.config.worker_id,
                              w.draining, w.transfer_totals(), w.metrics.recent())

    async def refresh_metrics(self) -> None:
        """Snapshot the engine and the pushes for the next /metrics scrape."""
        self.metrics.update(await self.worker.stats(), self.worker.transfer_totals())

    def begin_drain(self) -> None:
        """Refuse new prefills."""
        self.worker.begin_drain()

    async def wait_idle(self) -> None:
        """Until no prefill is in progress."""
        await self.worker.wait_idle()

    async def close(self) -> None:
        """Abort leftovers; close the sender and the engine."""
        await self.worker.close()


async def build_prefill_app(
    args: argparse.Namespace, engine_config: EngineConfig, secret: bytes
) -> PrefillApp:
    """Load the engine, make the KV sender, install the layer hook."""
    engine = load_engine(engine_config)
    metrics = WorkerMetrics("prefill")
    ae = AsyncEngine(engine, on_step=metrics.observe_step)
    layout = kv_layout(engine.kv_layout(), engine.kv_cache)
    sender = Sender(engine.kv_cache, layout,
                    SenderConfig(secret=secret, prefer_shm=not args.no_kv_shm))
    worker_id = args.worker_id or f"prefill-{socket.gethostname()}-{os.getpid()}"
    worker = PrefillWorker(ae, sender, PrefillConfig(
        worker_id=worker_id, transfer_timeout_s=args.transfer_timeout_s), metrics)
    await worker.start()
    return PrefillApp(worker)
