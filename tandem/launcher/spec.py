"""What ``tandem up`` launches: one frozen, validated description shared by every actor.

Names: everything lives in the Ray namespace ``namespace`` (default ``tandem``), so ``tandem
down`` finds and stops exactly what ``up`` started. The pool actor is ``tandem-registry``
(workers ask it where the router is), the router ``tandem-router``, the autoscaler
``tandem-controller``, workers ``tandem-prefill-<n>`` / ``tandem-decode-<n>``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from tandem.autoscaler.config import AutoscaleConfig

NAMESPACE = "tandem"
REGISTRY = "tandem-registry"
ROUTER = "tandem-router"
CONTROLLER = "tandem-controller"


def worker_name(role: str, index: int) -> str:
    """The Ray actor name of worker ``index`` of ``role``."""
    return f"tandem-{role}-{index}"


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """A whole Tandem cluster on Ray.

    ``worker_args`` / ``router_args`` are extra flags passed verbatim to the standalone
    commands' parsers (``tandem prefill|decode`` and ``tandem router``), so every flag those
    commands have works here too; ``prefill_args`` / ``decode_args`` go to one role's workers
    only, after ``worker_args``. ``resources`` are Ray custom resources every worker asks for.

    ``prefill_ranks`` / ``decode_ranks``: the role's ``--tensor-parallel-size`` (what its
    flags above say; tandem/launcher/tensor_parallel.py reads it). A worker of N ranks is one
    actor holding N devices: ``prefill_gpus``/``decode_gpus`` are GPUs per worker, 0 or N
    (one whole device per rank), and it asks for ``cpus_per_worker`` CPUs per rank.
    """

    model: str = "smollm2"
    model_name: str = ""
    prefill: int = 1
    decode: int = 1
    host: str = "127.0.0.1"  # the router's listen address
    port: int = 50051
    http_port: int | None = 8000  # None: the router's own default
    prefill_gpus: float = 0.0
    decode_gpus: float = 0.0
    prefill_ranks: int = 1  # --tensor-parallel-size of a prefill worker
    decode_ranks: int = 1
    cpus_per_worker: float = 1.0
    router_cpus: float = 0.0
    resources: tuple[tuple[str, float], ...] = ()
    threads: int | None = None
    worker_args: tuple[str, ...] = ()
    router_args: tuple[str, ...] = ()
    prefill_args: tuple[str, ...] = ()
    decode_args: tuple[str, ...] = ()
    namespace: str = NAMESPACE
    detach: bool = False
    max_restarts: int = 3
    pack_pairs: bool = True  # one prefill + one decode per node (shm / CUDA IPC transport)
    signal_window_s: float = 10.0  # workers' latency window, seen by the autoscaler
    ready_timeout_s: float = 600.0
    dead_after_s: float = 120.0  # a worker unreachable this long is given up on
    autoscale: AutoscaleConfig | None = field(default=None)
    # The cluster credential every actor needs (hex; each writes it to a private file on its
    # node). "" with ``insecure``: none at all, asked for explicitly.
    cluster_secret: str = field(default="", repr=False)
    insecure: bool = False
    # The router's API keys as key-file text (tandem/launcher/api_keys.py; "" for none): the
    # router actor writes them to a private file on its node.
    api_keys: str = field(default="", repr=False)
    # True in the copy the pool actor is built with (``without_secrets``): the two secrets
    # above reach it apart, by a method call.
    secrets_apart: bool = False
    worker_host: str = ""  # workers' listen address ("": their node's IP, for other nodes)
    # Each worker's Prometheus /metrics, on its listen address: 0 a free port (in ``tandem
    # status``), -1 none; a fixed port needs one worker per node (a Kubernetes pod each).
    worker_metrics_port: int = 0

    def __post_init__(self) -> None:
        checks = {
            "prefill": self.prefill >= 0,
            "decode": self.decode >= 1,
            "port": 0 <= self.port <= 65535,
            "http_port": self.http_port is None or -1 <= self.http_port <= 65535,
            "prefill_gpus": self.prefill_gpus >= 0,
            "decode_gpus": self.decode_gpus >= 0,
            "prefill_ranks": self.prefill_ranks >= 1,
            "decode_ranks": self.decode_ranks >= 1,
            "cpus_per_worker": self.cpus_per_worker >= 0,
            "router_cpus": self.router_cpus >= 0,
            "threads": self.threads is None or self.threads >= 1,
            "max_restarts": self.max_restarts >= -1,
            "signal_window_s": self.signal_window_s > 0,
            "ready_timeout_s": self.ready_timeout_s > 0,
            "dead_after_s": self.dead_after_s > 0,
            "worker_metrics_port": -1 <= self.worker_metrics_port <= 65535,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid launch spec: {', '.join(bad)} out of range")
        if not self.model:
            raise ValueError("invalid launch spec: --model is empty")
        for role in ("prefill", "decode"):
            ranks, gpus = self.ranks(role), self.gpus(role)
            if ranks > 1 and gpus not in (0, ranks):
                raise ValueError(
                    f"--{role}-gpus {gpus:g} with --tensor-parallel-size {ranks}: a "
                    f"tensor-parallel worker holds one whole GPU per rank, so --{role}-gpus "
                    f"is {ranks} (GPUs per worker) or 0 (ranks on the CPU)")
        if self.secrets_apart:
            if self.cluster_secret or self.api_keys:
                raise ValueError("invalid launch spec: secrets in a spec that holds none")
        elif bool(self.cluster_secret) == self.insecure:
            raise ValueError("invalid launch spec: exactly one of a cluster secret and "
                             "insecure is required")

    def without_secrets(self) -> LaunchSpec:
        """This spec less the cluster secret and the API keys: what actors are built with.
        Ray keeps an actor's constructor arguments in the GCS (in its actor table, and in
        Redis with GCS fault tolerance), so no secret goes there; the pool actor gets them by
        a method call (``PoolActor.start``) and hands them out the same way."""
        return dataclasses.replace(self, cluster_secret="", api_keys="", secrets_apart=True)

    def gpus(self, role: str) -> float:
        """GPUs one worker of ``role`` asks for."""
        return self.prefill_gpus if role == "prefill" else self.decode_gpus

    def ranks(self, role: str) -> int:
        """Rank processes (``--tensor-parallel-size``) of one worker of ``role``."""
        return self.prefill_ranks if role == "prefill" else self.decode_ranks

    def cpus(self, role: str) -> float:
        """Ray CPUs one worker of ``role`` asks for: ``cpus_per_worker`` per rank."""
        return self.cpus_per_worker * self.ranks(role)

    @property
    def flips(self) -> bool:
        """Whether the workers may switch roles: not when either role is a tensor-parallel
        group (its ranks' KV endpoints serve one role: tandem/worker/dual/app.py)."""
        return self.prefill_ranks == self.decode_ranks == 1

    def role_args(self, role: str) -> tuple[str, ...]:
        """The extra flags of ``role``'s workers alone (``--prefill-arg`` / ``--decode-arg``)."""
        return self.prefill_args if role == "prefill" else self.decode_args

    def bundle(self, role: str) -> dict[str, float]:
        """The Ray resource bundle of one worker of ``role`` (placement groups, autoscaler):
        a tensor-parallel worker's is one bundle of all its ranks' devices, so Ray places
        the whole group on one node or not at all."""
        out: dict[str, float] = {"CPU": self.cpus(role)} if self.cpus_per_worker else {}
        if self.gpus(role):
            out["GPU"] = self.gpus(role)
        out.update(dict(self.resources))
        return out or {"CPU": 0.001}  # a bundle may not be empty
