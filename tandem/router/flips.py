"""Whether the router flips a worker's role on an operator's (or the autoscaler's) word
(RouterAdmin.FlipWorker, tandem/router/admin.py). Refused, with the reason:

- the worker serves that role already;
- a flip of it is in progress (one at a time per worker);
- it is being drained;
- it is the last routable worker of its role and ``force`` is not set: the pool would have
  none (prefill: every request would be prefilled on a decode worker, colocated; decode: no
  request could be served at all until the flip ends). With ``force`` it flips; a decode
  worker's streams that cannot move (no other decode worker) finish on it first.
"""

from __future__ import annotations

from tandem.placement.worker_view import Role
from tandem.router.membership.registry import Registry


def flip_refusal(registry: Registry, endpoint: str, old: Role, to: Role, force: bool,
                 in_progress: bool) -> str:
    """Why ``endpoint`` (serving ``old``) is not to flip to ``to`` ("": it may)."""
    if in_progress:
        return f"a flip of {endpoint} is in progress"
    if old is to:
        return f"{endpoint} serves {to.value} already"
    if registry.draining(endpoint):
        return f"{endpoint} is draining"
    others = [v for v in registry.routable(old) if v.endpoint != endpoint]
    if not others and not force:
        return (f"{endpoint} is the last routable {old.value} worker: flipping it leaves "
                f"no {old.value} worker (force to flip it anyway)")
    return ""
