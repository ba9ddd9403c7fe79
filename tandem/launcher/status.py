"""``tandem status``: what ``tandem up`` runs, where, its endpoints and health.

    router   grpc 10.0.0.5:50051  http 10.0.0.5:8000  node 10.0.0.5
    prefill-0  serving  10.0.0.5:41234  node 10.0.0.5  registered  restarts 0  metrics 10.0.0.5:9090
    decode-0   serving  10.0.0.5:40111  node 10.0.0.5  registered  restarts 0  metrics 10.0.0.5:9091
    autoscaler slo: prefill 1 -> 1 (follow; ttft_p90_s=0.12) ...
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tandem.common.arg_parser import ArgParser
from tandem.launcher.up_state import add_cluster_args


def build_parser() -> argparse.ArgumentParser:
    """Flags of ``tandem status``."""
    p = ArgParser(prog="tandem status", description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cluster_args(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def format_status(status: dict[str, Any]) -> str:
    """The human-readable table."""
    r = status["router"]
    lines = [f"router      grpc {r.get('grpc')}  http {r.get('http', '-')}  "
             f"node {r.get('node')}  pid {r.get('pid')}"]
    for w in status["workers"]:
        health = "registered" if w.get("registered") else "not registered"
        lines.append(f"{w['role'] + '-' + str(w['index']):<11} {w['state']:<10} "
                     f"{w.get('grpc', '-'):<22} node {w.get('node', '-')}  {health}  "
                     f"restarts {w['restarts']}"
                     + (f"  metrics {w['metrics']}" if w.get("metrics") else "")
                     + (f"  error: {w['error']}" if 'error' in w else ""))
    auto = status.get("autoscaler")
    if auto:
        for d in auto.get("decisions", []):
            p = d["proposal"]
            lines.append(f"autoscaler {auto['policy']}: {d['role']} {d['current']} -> "
                         f"{d['desired']} ({d['reason']}; {p['signal']}={p['value']:.4g})")
    lines.append(f"replicas    {status['replicas']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the cluster's state; 1 when nothing runs in ``--namespace``."""
    args = build_parser().parse_args(argv)
    from tandem.launcher.connect import find_pool, join_recorded

    code, _ = join_recorded("tandem status", args.address, args.namespace)
    if code:
        return code
    import ray  # after dial_env: Ray reads its authentication mode as it is imported

    pool = find_pool(args.namespace)
    if pool is None:
        print(f"tandem status: nothing running in namespace {args.namespace!r}", file=sys.stderr)
        return 1
    status = ray.get(pool.status.remote(), timeout=60)
    print(json.dumps(status, default=str) if args.json else format_status(status))
    return 0
