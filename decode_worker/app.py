"""The decode role as a process: engine + KV receiver + DecodeService (see ``process.serve``)."""

from __future__ import annotations

import argparse
import os
import socket

import grpc

from decode_worker.convert import kv_layout, layout_to_proto, stats_to_proto
from decode_worker.metrics import WorkerMetrics
from decode_worker.process import StartupError, load_engine
from decode_worker.service import DecodeConfig, DecodeWorker
from decode_worker.servicer import DecodeServicer
from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from kv_transfer import Receiver, ReceiverConfig
from protos.tandem.v1 import worker_pb2, worker_pb2_grpc

SERVICE_NAME = worker_pb2.DESCRIPTOR.services_by_name["DecodeService"].full_name


class DecodeApp:
    """A started ``DecodeWorker`` plus what the process runtime needs from it."""

    role = "decode"
    service_name = SERVICE_NAME

    def __init__(self, worker: DecodeWorker, receiver: Receiver) -> None:
        self.worker = worker
        self.receiver = receiver
        self.metrics: WorkerMetrics = worker.metrics

    def add_to_server(self, server: grpc.aio.Server) -> None:
        """Register the DecodeService servicer."""
        worker_pb2_grpc.add_DecodeServiceServicer_to_server(DecodeServicer(self.worker), server)

    def ready_info(self) -> dict[str, str]:
        """The KV receiver's TCP address for the READY line."""
        return {"kv": self.receiver.endpoint.address("tcp") or ""}

    def register_request(self, endpoint: str) -> worker_pb2.RegisterRequest:
        """How this worker introduces itself to a router."""
        return worker_pb2.RegisterRequest(
            role=worker_pb2.ROLE_DECODE, worker_id=self.worker.config.worker_id,
            endpoint=endpoint, kv_endpoint=self.receiver.endpoint.encode(),
            layout=layout_to_proto(self.worker.layout),
        )

    async def stats_proto(self) -> worker_pb2.WorkerStats:
        """Stats for heartbeats."""
        w = self.worker
        return stats_to_proto(await w.stats(), worker_pb2.ROLE_DECODE, w.config.worker_id,
                              w.draining, w.transfer_totals(), w.metrics.recent())

    async def refresh_metrics(self) -> None:
        """Snapshot the engine and the receiver for the next /metrics scrape."""
        self.metrics.update(await self.worker.stats(), self.worker.transfer_totals())

    def begin_drain(self) -> None:
        """Refuse new reservations."""
        self.worker.begin_drain()

    async def wait_idle(self) -> None:
        """Until nothing is reserved or streaming."""
        await self.worker.wait_idle()

    async def close(self) -> None:
        """Abort leftovers; stop the receiver and the engine."""
        await self.worker.close()


async def build_decode_app(
    args: argparse.Namespace, engine_config: EngineConfig, secret: bytes
) -> DecodeApp:
    """Load the engine, start the KV receiver on ``--kv-port`` and the worker logic."""
    engine = load_engine(engine_config)
    metrics = WorkerMetrics("decode")
    ae = AsyncEngine(engine, on_step=metrics.observe_step)
    layout = kv_layout(engine.kv_layout(), engine.kv_cache)
    receiver = Receiver(engine.kv_cache, layout, ReceiverConfig(
        secret=secret, host=args.kv_host or args.host, port=args.kv_port,
        enable_shm=not args.no_kv_shm))
    try:
        await receiver.start()
    except OSError as exc:
        await ae.shutdown()
        raise StartupError(f"cannot listen for KV on port {args.kv_port}: {exc}") from exc
    worker_id = args.worker_id or f"decode-{socket.gethostname()}-{os.getpid()}"
    worker = DecodeWorker(ae, receiver, DecodeConfig(
        worker_id=worker_id, default_lease_s=args.default_lease_s), metrics)
    await worker.start()
    return DecodeApp(worker, receiver)
