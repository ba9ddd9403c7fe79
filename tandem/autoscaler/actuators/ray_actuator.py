"""Scale worker actors on Ray through the launcher's pool actor.

    scale(role, n, victims): request_resources(bundles for every replica wanted)  # nodes
                    pool.scale(role, n, victims)   # ahead of demand; new actors (pending ones
                                  # wake Ray's autoscaler); fewer: the victims (else the
                                  # newest) drain, then exit

The pool actor (``tandem.launcher.pool``) owns the actors; this side only asks. Requesting
resources first lets a KubeRay or VM cluster start nodes while the actors are being created,
instead of after they are found pending.

Role flips: ``flip(worker, role)`` asks the pool actor, which asks the router
(RouterAdmin.FlipWorker): the router stops sending the worker its old role's work, moves its
decode streams live to other decode workers, has the worker switch with its weights loaded
(every worker actor runs the runtime that serves either role, tandem/worker/dual/) and counts
it in its new pool; the pool counts it in the new role from the call on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from tandem.autoscaler.roles import ROLES, RoleName

log = logging.getLogger(__name__)


class RayActuator:
    """An ``tandem.autoscaler.controller.Actuator`` over a pool actor handle."""

    def __init__(self, pool: Any, bundles: dict[str, dict[str, float]],
                 request_resources: bool = True, flips: bool = True) -> None:
        """``bundles``: one worker's resources per role, the whole group's for a
        tensor-parallel worker (N GPUs: what a scale-up asks the cluster for); ``flips``:
        False where the workers cannot switch roles (tensor-parallel groups keep theirs)."""
        self._pool = pool
        self._flips = flips
        self._bundles = bundles
        self._request = request_resources

    async def replicas(self) -> dict[RoleName, int]:
        """Workers per role the pool counts (starting ones included, draining ones not)."""
        counts = await self._pool.replicas.remote()
        return {role: int(counts[role]) for role in ROLES}

    async def scale(self, role: RoleName, replicas: int, victims: Sequence[str] = ()) -> None:
        """Ask for the resources of the whole desired cluster, then resize ``role`` (fewer:
        drain ``victims``, worker ids, before any other)."""
        if self._request:
            counts = await self.replicas()
            counts[role] = replicas
            bundles = [self._bundles[r] for r in ROLES for _ in range(counts[r])]
            await asyncio.to_thread(request_bundles, bundles)
        await self._pool.scale.remote(role, replicas, list(victims))

    @property
    def can_flip(self) -> bool:
        """Whether the workers can switch roles at runtime: every worker actor runs the
        runtime that serves either (the module docstring), but a tensor-parallel group keeps
        its role (its ranks' KV endpoints serve one), so a pool of groups does not flip."""
        return self._flips

    async def flip(self, worker: str, to_role: RoleName) -> None:
        """Flip ``worker`` (a worker id) to ``to_role`` through the pool actor and the router;
        raises what the pool raises (no such serving worker, the router's refusal)."""
        await self._pool.flip.remote(worker, to_role)


def request_bundles(bundles: list[dict[str, float]]) -> None:
    """Ask Ray's cluster autoscaler for room for ``bundles`` (replaces any earlier ask;
    an empty list withdraws it)."""
    from ray.autoscaler.sdk import request_resources

    try:
        request_resources(bundles=bundles)
    except Exception:  # a hint only: a cluster without an autoscaler may refuse it
        log.debug("request_resources failed", exc_info=True)
