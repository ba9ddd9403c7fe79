"""Where a prompt's KV goes: one transfer between two single processes, or the routes of a
re-sharded push between tensor-parallel groups (tandem/kv_transfer/reshard.py).

    own group (this worker's ranks) + the decode worker's kv_endpoint (a plain endpoint: a
    group of one; a group endpoint: its ranks and head ranges) + its layout as the router
    passed it on ──plan_push──> PushPlan: which rank sends which heads where, how many parts
    fill each decode rank, which rank commits each

A pair that cannot be re-sharded (another model, dtype, block size, head size or number of
KV heads) is refused here, before anything is computed, with ``LayoutMismatch`` naming the
fields; the HELLO of every route checks it again.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.kv_transfer import ConfigError, Endpoint, LayoutMismatchError
from tandem.kv_transfer.group_endpoint import GroupEndpoint
from tandem.kv_transfer.reshard import (
    GroupKv,
    Route,
    check_reshardable,
    committer,
    parts_into,
    routes,
)
from tandem.worker.errors import BadRequest, LayoutMismatch
from tandem.worker.kv_endpoint import parse_endpoint
from tandem.worker.layout import LayoutSummary, layout_mismatch


@dataclass(frozen=True, slots=True)
class PushPlan:
    """One push: the decode ranks' endpoints and, when either side is a group, the routes."""

    endpoints: tuple[Endpoint, ...]  # by decode rank
    routes: tuple[Route, ...] = ()  # empty: one plain transfer to endpoints[0]
    parts: tuple[int, ...] = (1,)  # by decode rank: the routes that fill its reservation
    committers: tuple[int, ...] = (0,)  # by decode rank: the prefill rank that commits it

    @property
    def plain(self) -> bool:
        """One process on each side: today's single transfer (no route stated at HELLO)."""
        return not self.routes

    def of_rank(self, rank: int) -> list[Route]:
        """The routes prefill rank ``rank`` pushes."""
        return [r for r in self.routes if r.src == rank]

    def frame(self, rank: int) -> dict[str, object]:
        """What prefill rank ``rank``'s agent is told to push (tandem/worker/tp_rank.py)."""
        mine = self.of_rank(rank)
        return {"routes": [[r.src, r.dst, r.start, r.stop, r.src_offset, r.dst_offset]
                           for r in mine],
                "parts": list(self.parts), "endpoints": [e.encode() for e in self.endpoints],
                "commit": [r.dst for r in mine if self.committers[r.dst] == rank]}


def plan_push(own: GroupKv, kv_endpoint: str, theirs: LayoutSummary) -> PushPlan:
    """The plan for pushing from this worker's group ``own`` to the decode worker at
    ``kv_endpoint`` whose layout is ``theirs``. Raises BadRequest (an endpoint that does not
    parse) or LayoutMismatch (a pair nobody can re-shard)."""
    try:
        if GroupEndpoint.is_group(kv_endpoint):
            target = GroupEndpoint.decode(kv_endpoint)
            dst, endpoints = target.group, target.ranks
            if theirs.fingerprint != dst.layout.fingerprint:
                raise LayoutMismatch("the decode worker's stated layout is not its group's")
        else:
            endpoints = (parse_endpoint(kv_endpoint),)
            dst = None
    except ConfigError as exc:
        raise BadRequest("kv_endpoint", str(exc)) from exc
    if dst is None:
        if own.world == 1:  # one process each side: the layouts must be equal
            mismatch = layout_mismatch(own.layout, theirs)
            if mismatch is not None:
                raise LayoutMismatch(mismatch)
            return PushPlan(endpoints)
        whole = own.whole()
        mismatch = layout_mismatch(whole, theirs)
        if mismatch is not None:
            raise LayoutMismatch(mismatch)
        dst = GroupKv.single(whole)
    try:
        check_reshardable(own, dst)
    except LayoutMismatchError as exc:
        raise LayoutMismatch(str(exc)) from exc
    every = routes(own, dst)
    return PushPlan(endpoints, tuple(every),
                    tuple(parts_into(every, d) for d in range(dst.world)),
                    tuple(committer(every, d) for d in range(dst.world)))
