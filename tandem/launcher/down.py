"""``tandem down``: drain and stop everything ``tandem up`` started, and nothing else.

Which cluster: ``--address`` when given; else the one a ``tandem up`` on this machine recorded
for ``--namespace`` (tandem/launcher/up_state.py: the GCS address it actually bound, so a
loopback-only local Ray instance is found at once); else Ray's ``auto``.

Only the Ray namespace ``up`` used (``--namespace``, default ``tandem``) is touched: the pool
drains the router (no new requests, those in flight finish) and every worker (each finishes
what it has), kills their actors and removes its placement groups; then the pool itself and
any named actor still left in the namespace are ended. A Ray cluster given with ``--address``
keeps running; a local instance that ``tandem up`` started ends with that ``tandem up``, which
sees its pool gone and exits: ``down`` waits for it (and sends it SIGTERM if it lingers).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

from tandem.common.arg_parser import ArgParser
from tandem.launcher import up_state

# How long a foreground `tandem up` may take to notice its pool is gone and exit (it looks
# every second; its Ray instance's shutdown takes a few more), then after a SIGTERM.
_UP_EXIT_S = 60.0
_UP_TERM_S = 30.0


def build_parser() -> argparse.ArgumentParser:
    """Flags of ``tandem down``."""
    p = ArgParser(prog="tandem down", description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter)
    up_state.add_cluster_args(p)
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
    from tandem.launcher.connect import find_pool, join_recorded

    code, state = join_recorded(
        "tandem down", args.address, args.namespace,
        lambda st: f" (the tandem up that started it, pid {st.pid}, has ended)")
    if code:
        return code
    pool = find_pool(args.namespace)
    if pool is None:
        leftovers = sweep(args.namespace)
        _forget(state)
        print(f"tandem down: nothing running in namespace {args.namespace!r}"
              + (f" (ended stray actors: {', '.join(leftovers)})" if leftovers else ""),
              file=sys.stderr)
        return 1
    state = state or _recorded_here(args.namespace)
    result = stop_pool(pool, args.namespace)
    _forget(state)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"stopped: {', '.join(result['stopped'])}"
              + ("" if result.get("drained", True) else "  (router drain timed out)"))
    return 0


def _recorded_here(namespace: str) -> up_state.UpState | None:
    """The state file of the cluster just dialled by ``--address``, when a ``tandem up`` on
    this machine recorded it (it goes with the cluster)."""
    import ray

    try:
        state = up_state.read(namespace)
    except up_state.UpStateError:
        return None
    dialled = ray.get_runtime_context().gcs_address
    return state if state is not None and state.address == dialled else None


def _forget(state: up_state.UpState | None) -> None:
    """Leave the Ray instance, let the ``tandem up`` that owns it end (it does once its pool
    is gone; its Ray instance goes with it), and remove its state file."""
    if state is None:
        return
    import ray

    ray.shutdown()  # before that Ray instance ends under this driver
    if state.owns_ray and not _ended(state, _UP_EXIT_S):
        print(f"tandem down: tandem up (pid {state.pid}) still runs after "
              f"{_UP_EXIT_S:g} s: sending it SIGTERM", file=sys.stderr)
        os.kill(state.pid, signal.SIGTERM)
        if not _ended(state, _UP_TERM_S):
            print(f"tandem down: tandem up (pid {state.pid}) did not exit", file=sys.stderr)
            return
    up_state.remove(state.namespace, state.pid)


def _ended(state: up_state.UpState, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for the ``tandem up`` of ``state`` to exit."""
    deadline = time.monotonic() + timeout_s
    while state.alive():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
