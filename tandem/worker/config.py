"""What a worker process is started with, as frozen values (built from flags by ``cli``).

    flags ──tandem.worker.cli──> WorkerConfig(serve (with the cluster credential), engine, worker_id,
                                       kv_shm)
          ──role cli────> DecodeAppConfig / PrefillAppConfig(worker=WorkerConfig, role fields)
          ──role app────> the running role (``build_*_app(config)``)

Nothing below the command line sees an ``argparse.Namespace``: a Ray actor, a test or an
embedding program builds these directly.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import grpc

from tandem.common.model_spec import served_name
from tandem.common.security.credential import ClusterCredential
from tandem.engine.config import EngineConfig
from tandem.kv_transfer import TlsConfig
from tandem.worker.tls import ServerTls


class StartupError(Exception):
    """The worker cannot start (busy port, bad flag value, unreadable secret or model)."""


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """Where to listen, who may call, and how to stop. ``credential`` guards every RPC but
    health and proves this worker to the router; None refuses to serve (there is no built-in
    secret: ``ClusterCredential.insecure_default()`` is the explicit ``--insecure``)."""

    credential: ClusterCredential | None = None
    host: str = "127.0.0.1"
    port: int = 0
    router: str | None = None
    drain_timeout_s: float = 60.0
    stop_grace_s: float = 5.0
    metrics_port: int = -1  # Prometheus /metrics: -1 off, 0 a free port
    metrics_host: str | None = None  # default: ``host``
    tls: ServerTls | None = None  # TLS (mTLS with a client CA) on the gRPC port
    router_credentials: grpc.ChannelCredentials | None = None  # registering with a TLS router
    # Other addresses callers dial this worker by (a proxy, a Service, NAT): tokens minted for
    # them are accepted beside those for the bound address (tandem/common/security/grpc_auth.py)
    advertise: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """What both roles are started with: serving (and the credential), the engine, an
    identity, the KV transports."""

    serve: ServeConfig
    engine: EngineConfig
    worker_id: str | None = None  # None: ``<role>-<hostname>-<pid>``
    kv_shm: bool = True  # same-host shared memory for KV, else TCP only
    kv_tls: TlsConfig | None = None  # TLS on KV over TCP (the credential authenticates anyway)
    kv_codec: str = "raw"  # KV payload codec over TCP: asked (prefill), accepted (decode)
    kv_stripes: int | None = None  # TCP connections per transfer: used (prefill), allowed (decode)
    served_model_name: str = ""  # /metrics' model_name label ("": from the engine's model)
    metrics_compat: str = "vllm"  # "vllm": /metrics also has vLLM's names (docs/metrics.md)
    core_share: str | None = None  # a host's core-share file (tandem/worker/core_lending.py)
    adaptive_threads: bool = True  # decode: each step on half or all threads, the faster
    step_log: str | None = None  # a line per model step appended here (tandem/worker/step_log.py)
    warmup: bool = True  # a few synthetic steps before serving (tandem/engine/warmup.py)

    @property
    def model_name(self) -> str:
        """The served model id this worker's metrics carry: ``served_model_name``, else the
        router's default for the same ``--model`` (the alias, the GGUF's stem or the
        directory's name: tandem.common.model_spec)."""
        return self.served_model_name or served_name(self.engine.model.model)

    @property
    def kv_secret(self) -> bytes:
        """The KV handshake's key, derived from the cluster credential."""
        if self.serve.credential is None:
            raise StartupError("no cluster credential: the KV port cannot be keyed")
        return self.serve.credential.kv_secret

    def resolved_worker_id(self, role: str) -> str:
        """The id this worker registers under."""
        return self.worker_id or f"{role}-{socket.gethostname()}-{os.getpid()}"
