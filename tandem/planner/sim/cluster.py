"""What is simulated: the pools, the router's placement settings, and the events that change
the pools while the trace runs (a worker failing, a pool being resized)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.placement.slo import Slo
from tandem.placement.worker_view import Role
from tandem.planner.sim.host import HostSharing
from tandem.planner.sim.signals import SIGNALS

PLACEMENTS = ("adaptive", "remote", "local")


class ClusterError(ValueError):
    """A cluster or event that cannot be simulated (negative pools, unknown placement)."""


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """The pools and the router's settings (tandem/router/config.py's names and defaults).

    ``placement``: "adaptive" (cost_model.decide against ``slo`` per request), "remote"
    (always a prefill worker when one is routable) or "local" (every decode worker prefills
    its own requests: the colocated deployment, also what ``prefill_workers == 0`` gives).
    ``local_prefill_threshold`` > 0 is the router's fixed override: prompts shorter than it
    are prefilled locally, the rest remotely, whatever ``placement`` says (but "local").
    ``affinity_max_queue``, ``decode_affinity_slack``, ``prefill_attempts`` and
    ``max_migrations`` are the router's knobs of the same names. ``host_sharing``: the
    i-th prefill and the i-th decode worker share a host and slow each other down
    (tandem/planner/sim/host.py); None (the default): every worker has its own hardware.
    ``transfer_timeout_s``: the prefill workers' ``--transfer-timeout-s``: a remote prefill
    whose KV push ends later than this after the prompt reached the prefill worker fails
    (RESOURCE_EXHAUSTED: it queued too long), and the router tries the next prefill worker
    or prefills on the decode worker.
    ``signals``: what step costs the workers report to the router's policies, "fitted"
    (each its own online fit of the steps it ran, as real workers: tandem/planner/sim/signals.py)
    or "profile" (the profile's exact costs).
    ``report_interval_s``: how often a worker's load reaches the router, which reads the
    prompt tokens queued on a worker as the last report's figure or its own exact count,
    the larger (tandem/planner/sim/reports.py): 2 s, the health probe's Stats
    (``--health-interval``), all that workers given to the router by address get
    (``tandem local``, ``make serve``, scripts/bench_serve); workers that register also
    heartbeat every 2 s, about 1 s between reports; 0: the router knows every queue exactly.
    ``live_migration``: how a decode worker's streams move when it flips to prefill
    (:class:`RoleFlip`): with their KV over the link (True), or by re-prefilling prompt +
    tokens sent elsewhere, as a dead worker's (False).
    """

    prefill_workers: int
    decode_workers: int
    placement: str = "adaptive"
    local_prefill_threshold: int = 0
    slo: Slo = field(default_factory=lambda: Slo(2.0, 0.1))
    affinity_max_queue: int = 8
    decode_affinity_slack: int = 4
    prefill_attempts: int = 2
    max_migrations: int = 2
    host_sharing: HostSharing | None = None
    transfer_timeout_s: float = 30.0
    signals: str = "fitted"
    report_interval_s: float = 2.0
    live_migration: bool = True

    def __post_init__(self) -> None:
        if self.prefill_workers < 0 or self.decode_workers < 0:
            raise ClusterError("pool sizes must be >= 0")
        if self.placement not in PLACEMENTS:
            raise ClusterError(f"placement must be one of {PLACEMENTS}, not {self.placement!r}")
        if not self.transfer_timeout_s > 0:
            raise ClusterError("transfer_timeout_s must be > 0")
        if not self.report_interval_s >= 0:
            raise ClusterError("report_interval_s must be >= 0")
        if self.signals not in SIGNALS:
            raise ClusterError(f"signals must be one of {SIGNALS}, not {self.signals!r}")
        if self.local_prefill_threshold < 0 or self.prefill_attempts < 1:
            raise ClusterError("local_prefill_threshold >= 0 and prefill_attempts >= 1")
        if self.max_migrations < 0 or self.affinity_max_queue < 0:
            raise ClusterError("max_migrations and affinity_max_queue must be >= 0")
        if not (self.slo.ttft_s > 0 and self.slo.tpot_s > 0):
            raise ClusterError("SLO targets must be > 0")


def _role(role: Role | str) -> Role:
    try:
        return Role(role)
    except ValueError as exc:
        raise ClusterError(f"role must be 'prefill' or 'decode', not {role!r}") from exc


@dataclass(frozen=True, slots=True)
class Failure:
    """At ``at_s`` the ``index``-th worker ever started in ``role``'s pool dies (the initial
    workers are 0 .. n-1, scaled-up ones follow in start order). Its work is retried as the
    router does: prefills on another prefill worker or locally, decode streams migrated."""

    at_s: float
    role: Role
    index: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "role", _role(self.role))
        if self.at_s < 0 or self.index < 0:
            raise ClusterError(f"bad failure {self}: at_s >= 0, index >= 0")


@dataclass(frozen=True, slots=True)
class Scale:
    """At ``at_s`` ``role``'s pool is set to ``count`` workers: new ones take work after
    ``startup_s``; removed ones drain (no new work, gone when empty): those still starting
    first, then the ``victims`` (endpoints, in order), then the newest."""

    at_s: float
    role: Role
    count: int
    startup_s: float = 0.0
    victims: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "role", _role(self.role))
        if self.at_s < 0 or self.count < 0 or self.startup_s < 0:
            raise ClusterError(f"bad scale event {self}: at_s, count, startup_s >= 0")


@dataclass(frozen=True, slots=True)
class RoleFlip:
    """At ``at_s`` the ``index``-th worker ever started in ``role``'s pool (if it serves)
    switches to the other role with its weights loaded: a prefill worker takes no new
    prompts and finishes its queued ones, a decode worker's streams move to other decode
    workers at once (``ClusterSpec.live_migration``); ``flip_s`` after that it serves in
    the other pool, a new worker there (the next index) on the same GPUs."""

    at_s: float
    role: Role
    index: int
    flip_s: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "role", _role(self.role))
        if self.at_s < 0 or self.index < 0 or self.flip_s < 0:
            raise ClusterError(f"bad role flip {self}: at_s, index, flip_s >= 0")


Event = Failure | Scale | RoleFlip
