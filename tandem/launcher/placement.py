"""Where actors go: pairs packed per node, replicas spread, the control plane at home.

    pair i:  placement group "tandem-pair-i", STRICT_PACK [prefill bundle, decode bundle]
             -> prefill-i and decode-i share a node (KV over shared memory / CUDA IPC)
    others:  SPREAD -> replicas of a role on different nodes where there are several
    router, pool, controller: hard affinity to the node `tandem up` ran on ("home")

A tensor-parallel worker of N ranks is one actor asking for all N devices at once
(:func:`worker_resources`): Ray places it on one node with all of them, or not yet
(tandem/launcher/pool.py says why one actor rather than N). Pairs of such workers are packed
only where a node of the cluster holds both (:func:`fits_one_node`): two 8-GPU groups fit
no 8-GPU node, and their pair group would never be placed.
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


def fits_one_node(bundles: list[dict[str, float]], nodes: list[dict[str, float]]) -> bool:
    """Whether some node of ``nodes`` (each its total resources) holds all ``bundles`` at
    once: what a STRICT_PACK group of them needs to be placed at all."""
    need: dict[str, float] = {}
    for bundle in bundles:
        for key, amount in bundle.items():
            need[key] = need.get(key, 0.0) + amount
    return any(all(node.get(k, 0.0) >= v for k, v in need.items()) for node in nodes)


def worker_resources(spec: LaunchSpec, role: str) -> dict[str, Any]:
    """The Ray actor options of one worker of ``role``: its CPUs (per rank), its GPUs (one
    per rank of a tensor-parallel worker on GPUs) and the custom resources, as ``bundle``."""
    return {"num_cpus": spec.cpus(role), "num_gpus": spec.gpus(role),
            "resources": dict(spec.resources)}


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
