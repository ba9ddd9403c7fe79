"""Two checkouts' KV transports, A/B in one run: a baseline tree against this one.

    python -m bench.transfer.kv_transfer_ab --baseline /path/to/other/checkout [--requests 12]

Each round runs, one after another: the raw socket baseline, then for each case (TCP with
shuffled ids, TCP with contiguous ids, shm with shuffled ids) the baseline tree's transport and
this tree's (``--this-only``: then the cases only this tree has, shm with slot hashes off),
then memcpy. Each transport run is tandem/profiler/transfer_probe.py's
``run_ours`` started with the tree as its working directory, so parent and receiver child both
run that tree's code. Rounds interleave because the machine is shared: compare ratios within a
round (printed per round), not GB/s across runs. The load average goes beside every sample.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]
OURS = r'''
import asyncio, json, sys
from tandem.profiler.transfer_probe import make_cache, run_ours
s = asyncio.run(run_ours(sys.argv[1], int(sys.argv[2]), make_cache(True), sys.argv[3]))
print(json.dumps({"gbps": s.gbps, "tx": s.tx_cpu_per_gib, "rx": s.rx_cpu_per_gib}))
'''
BASE = r'''
import asyncio, json, sys
from bench.transfer.kv_transfer import run_memcpy, run_raw
n = int(sys.argv[2])
s = asyncio.run(run_raw(n)) if sys.argv[1] == "raw" else run_memcpy(n)
print(json.dumps({"gbps": s.gbps, "tx": s.tx_cpu_per_gib, "rx": s.rx_cpu_per_gib}))
'''
CASES = [("tcp", "shuffled"), ("tcp", "contiguous"), ("shm", "shuffled")]
# Cases only this tree has (no baseline run): shm with the receiver's slot hashes off.
THIS_ONLY = [("shm_unhashed", "shuffled")]


def sample(root: Path, code: str, *args: object) -> dict[str, float]:
    """One run of ``code`` in ``root`` (its JSON line), with the load average."""
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=root,
                         capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    result["load"] = os.getloadavg()[0]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", type=Path, required=True, help="the other checkout's root")
    ap.add_argument("--requests", type=int, default=12, help="2,048-token requests per run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--this-only", action="store_true",
                    help="also the cases only this tree has (shm with slot hashes off)")
    args = ap.parse_args()
    nbytes = args.requests * 30 * 2 * 128 * 6144  # SmolLM2-shaped requests (transfer_probe)
    runs: list[tuple[str, Path, str, tuple[object, ...]]] = [("raw", HERE, BASE, ("raw", nbytes))]
    for transport, order in CASES:
        for tree, root in (("baseline", args.baseline), ("this", HERE)):
            runs.append((f"{transport} {order} {tree}", root, OURS,
                         (transport, args.requests, order)))
    for transport, order in THIS_ONLY if args.this_only else []:
        runs.append((f"{transport} {order} this", HERE, OURS, (transport, args.requests, order)))
    runs.append(("memcpy", HERE, BASE, ("memcpy", nbytes)))
    res: dict[str, list[dict[str, float]]] = {}
    for r in range(args.rounds):
        for name, root, code, argv in runs:
            s = sample(root, code, *argv)
            res.setdefault(name, []).append(s)
            print(f"round {r + 1} {name:>26}: {s['gbps']:5.2f} GB/s  cpu-s/GiB tx {s['tx']:.2f} "
                  f"rx {s['rx']:.2f}  load {s['load']:.1f}", flush=True)
    raw, mem = res["raw"], res["memcpy"]
    print(f"\n{'run':>26} {'GB/s':>6} {'vs raw':>7} {'vs memcpy':>9} {'tx cpu/GiB':>10} "
          f"{'rx cpu/GiB':>10}  per round: vs raw | vs memcpy")
    for name, v in res.items():
        g = statistics.median(x["gbps"] for x in v)
        per = " ".join(f"{x['gbps'] / a['gbps']:.0%}|{x['gbps'] / m['gbps']:.0%}"
                       for x, a, m in zip(v, raw, mem, strict=True))
        print(f"{name:>26} {g:6.2f} {g / statistics.median(x['gbps'] for x in raw):7.0%} "
              f"{g / statistics.median(x['gbps'] for x in mem):9.0%} "
              f"{statistics.median(x['tx'] for x in v):10.2f} "
              f"{statistics.median(x['rx'] for x in v):10.2f}  {per}")


if __name__ == "__main__":
    main()
