"""What a worker tells the router about itself: who it is and where (``Registration``, sent at
Register) and its load right now (``WorkerStatus``, in every Heartbeat and Stats answer).

    role logic ──stats(), transfer_totals(), metrics.recent()──> WorkerStatus ─┐
    app shell ──config, endpoints, layout──> Registration ─────────────────────┼─ convert ──> protos
                                                   (registration client, servicers' Stats) ┘
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.engine.outputs import EngineStats
from tandem.kv_transfer import KvLayout
from tandem.worker.metrics import TransferTotals
from tandem.worker.recent import RecentFigures


@dataclass(frozen=True, slots=True)
class Registration:
    """How a worker introduces itself to a router."""

    role: str  # "prefill" | "decode"
    worker_id: str
    endpoint: str  # host:port of its gRPC service
    layout: KvLayout  # its KV cache layout (a peer's must match to exchange blocks)
    kv_endpoint: str = ""  # where peers push KV to it (kv_transfer Endpoint.encode(); decode)


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """A worker's load for the router and live views (``tandem top``)."""

    role: str  # "prefill" | "decode"
    worker_id: str
    engine: EngineStats
    draining: bool = False
    transfer: TransferTotals = field(default_factory=TransferTotals)
    recent: RecentFigures = field(default_factory=RecentFigures)  # last-minute percentiles
