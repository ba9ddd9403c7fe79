"""Where actors go: pairs packed per node, replicas spread, the control plane at home.

    pair i:  placement group "tandem-pair-i", STRICT_PACK [prefill bundle, decode bundle]
             -> prefill-i and decode-i share a node (KV over shared memory / CUDA IPC)
    others:  SPREAD -> replicas of a role on different nodes where there are several
    router, pool, controller: hard affinity to the node `tandem up` ran on ("home")
"""

from __future__ import annotations

import asyncio
from typing import Any

from tandem.launcher.spec import LaunchSpec


def home_strategy(node_id: str | None) -> Any:
    """Pin to ``node_id`` (no fallback elsewhere); Ray's default when unknown."""
    if node_id is None:
        return "DEFAULT"
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=False)


async def pair_group(spec: LaunchSpec, pair: int) -> Any:
    """A ready placement group holding one prefill and one decode bundle on one node."""
    from ray.util.placement_group import placement_group

    pg = placement_group([spec.bundle("prefill"), spec.bundle("decode")],
                         strategy="STRICT_PACK", name=f"tandem-pair-{pair}")
    await asyncio.wait_for(pg.ready(), spec.ready_timeout_s)
    return pg


def worker_strategy(role: str, pg: Any | None) -> Any:
    """The role's bundle of its pair's group, or SPREAD for a worker without a pair."""
    if pg is None:
        return "SPREAD"
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(
        pg, placement_group_bundle_index=0 if role == "prefill" else 1)
