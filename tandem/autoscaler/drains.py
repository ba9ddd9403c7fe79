"""Safe scale-down: how many workers may go now, and which.

    counted but not in the snapshot (still starting)   first: they hold nothing yet
    prefill   only workers holding no leased KV (no Prefill call in progress: its pushes
              write into decode blocks reserved for it), fewest queued first; the others
              are not removed now, and the stabilizer holds the rest of the decrease
    decode    every serving worker may go, fewest streams first: a draining decode worker
              finishes its streams for up to its drain timeout (--drain-timeout-s), then
              stops, and the router migrates what is left to another decode worker
              (re-prefills prompt + tokens sent; the client's stream goes on)

The controller hands the chosen workers to the actuator (``scale(role, n, victims)``); the
Ray pool drains those, the Kubernetes actuator cannot pick pods and ignores them. Pure: the
newest snapshot in, a plan out, for every policy alike (a policy proposes how many; this
module only says which, and how many of those may leave at once).
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.autoscaler.metrics import Snapshot, WorkerSample
from tandem.autoscaler.roles import RoleName


@dataclass(frozen=True, slots=True)
class DrainOptions:
    """What a scale-down of one role may remove now: ``removable`` workers at most, the
    serving ones in ``order`` (worker ids, first to go first)."""

    removable: int
    order: tuple[str, ...]


def drain_options(role: RoleName, snap: Snapshot, current: int) -> DrainOptions:
    """The removable workers of ``role`` (``current`` counts the starting ones too)."""
    serving = snap.of(role)
    starting = max(0, current - len(serving))
    if role == "prefill":
        eligible = [w for w in serving if w.leased_blocks == 0]
    else:
        eligible = list(serving)
    eligible.sort(key=_cost_of_draining)
    return DrainOptions(starting + len(eligible), tuple(w.worker_id for w in eligible))


def victims(options: DrainOptions, snap: Snapshot, role: RoleName, current: int,
            desired: int) -> tuple[str, ...]:
    """The serving workers to drain for ``current`` -> ``desired`` (starting ones first,
    which need no name: the actuator removes those before any serving one)."""
    if desired >= current:
        return ()
    starting = max(0, current - len(snap.of(role)))
    return options.order[:max(0, current - desired - starting)]


def _cost_of_draining(w: WorkerSample) -> tuple[int, float, str]:
    """Work a drain must finish or move: requests, then KV held; ties by id (stable)."""
    return (w.queue_depth, w.kv_cache_usage, w.worker_id)
