"""``tandem down``: drain and stop everything ``tandem up`` started, and nothing else.

Only the Ray namespace ``up`` used (``--namespace``, default ``tandem``) is touched: the pool
drains the router (no new requests, those in flight finish) and every worker (each finishes
what it has), kills their actors and removes its placement groups; then the pool itself and
any named actor still left in the namespace are ended. The Ray cluster itself keeps running.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tandem.common.arg_parser import ArgParser
from tandem.launcher.spec import NAMESPACE


def build_parser() -> argparse.ArgumentParser:
    """Flags of ``tandem down``."""
    p = ArgParser(prog="tandem down", description=__doc__)
    p.add_argument("--address", default="auto", help="Ray cluster address (default: auto)")
    p.add_argument("--namespace", default=NAMESPACE)
    p.add_argument("--json", action="store_true", help="print what was stopped as JSON")
    return p


def stop_pool(pool: Any, namespace: str | None = None) -> dict[str, Any]:
    """Drain and stop through ``pool``, end it, then sweep leftovers of ``namespace``."""
    import ray

    result: dict[str, Any] = {"stopped": [], "drained": False}
    try:
        result = ray.get(pool.down.remote())
    except Exception as exc:  # the pool is gone already: sweep by name below
        result["error"] = str(exc)[:300]
    ray.kill(pool, no_restart=True)
    result["stopped"] = [*result.get("stopped", []), "tandem-registry"]
    if namespace is not None:
        result["stopped"] += sweep(namespace)
    return result


def sweep(namespace: str) -> list[str]:
    """Kill every named actor left in ``namespace`` (ours only: nothing outside it)."""
    import ray

    killed = []
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry.get("namespace") != namespace:
            continue
        try:
            ray.kill(ray.get_actor(entry["name"], namespace=namespace), no_restart=True)
            killed.append(entry["name"])
        except ValueError:  # ended meanwhile
            continue
    return killed


def main(argv: list[str] | None = None) -> int:
    """Stop the cluster in ``--namespace``; 1 when nothing was running there."""
    args = build_parser().parse_args(argv)
    from tandem.launcher.connect import connect, find_pool

    connect(args.address, args.namespace, quiet=True)
    pool = find_pool(args.namespace)
    if pool is None:
        leftovers = sweep(args.namespace)
        print(f"tandem down: nothing running in namespace {args.namespace!r}"
              + (f" (ended stray actors: {', '.join(leftovers)})" if leftovers else ""),
              file=sys.stderr)
        return 1
    result = stop_pool(pool, args.namespace)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"stopped: {', '.join(result['stopped'])}"
              + ("" if result.get("drained", True) else "  (router drain timed out)"))
    return 0
