"""What a worker process is started with, as frozen values (built from flags by ``cli``).

    flags ──worker.cli──> WorkerConfig(serve, engine, kv_secret, worker_id, kv_shm)
          ──role cli────> DecodeAppConfig / PrefillAppConfig(worker=WorkerConfig, role fields)
          ──role app────> the running role (``build_*_app(config)``)

Nothing below the command line sees an ``argparse.Namespace``: a Ray actor, a test or an
embedding program builds these directly.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

import grpc

from engine.config import EngineConfig
from worker.tls import ServerTls


class StartupError(Exception):
    """The worker cannot start (busy port, bad flag value, unreadable secret or model)."""


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


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """What both roles are started with: serving, the engine, the KV secret, an identity."""

    serve: ServeConfig
    engine: EngineConfig
    kv_secret: bytes = field(repr=False)  # never in a log line
    worker_id: str | None = None  # None: ``<role>-<hostname>-<pid>``
    kv_shm: bool = True  # same-host shared memory for KV, else TCP only

    def resolved_worker_id(self, role: str) -> str:
        """The id this worker registers under."""
        return self.worker_id or f"{role}-{socket.gethostname()}-{os.getpid()}"
