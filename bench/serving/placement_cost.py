"""What one placement decision costs the router (target: < 100 us per request).

    python -m bench.serving.placement_cost [--out docs/bench]

Times ``tandem.placement.cost_model.decide`` on synthetic worker snapshots (one decode worker,
1-32 prefill candidates, every cost fitted, a prefix hit and a learned overhead), and next to
it, as the baseline the router already paid per request before placement existed, the prefix
hashing and prefill ranking of the same prompt. Prints microseconds per call (best of 5).
"""

from __future__ import annotations

import argparse
import json
import timeit
from pathlib import Path

from tandem.placement.affinity import PrefixAffinity, prefix_hashes
from tandem.placement.cost_model import decide
from tandem.placement.policy import rank_prefill
from tandem.placement.slo import Slo
from tandem.placement.worker_view import Role, WorkerView

PROMPT = list(range(800))


def _workers(n: int) -> tuple[WorkerView, list[WorkerView]]:
    decode = WorkerView("d0", Role.DECODE, num_running=8, step_base_s=0.03,
                        step_per_row_s=0.002, step_per_prefill_token_s=0.0004,
                        max_batched_tokens=512)
    prefill = [WorkerView(f"p{i}", Role.PREFILL, step_base_s=0.01,
                          step_per_prefill_token_s=0.0004, queued_prefill_tokens=500 * i,
                          max_batched_tokens=2048) for i in range(n)]
    return decode, prefill


def _per_call_us(fn: object, number: int = 5000) -> float:
    return min(timeit.Timer(fn).repeat(5, number)) / number * 1e6  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serving.placement_cost", description=__doc__,
                                allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None, help="write placement_cost.json here")
    args = p.parse_args(argv)
    slo = Slo(2.0, 0.1)
    affinity = PrefixAffinity(65536)
    hashes = prefix_hashes(PROMPT, 16)
    affinity.record(hashes[:16], "p0")
    rows = []
    for n in (1, 4, 8, 32):
        decode, prefill = _workers(n)
        owners = affinity.lookup(hashes)

        def baseline(prefill: list[WorkerView] = prefill) -> None:
            rank_prefill(prefill, affinity.lookup(prefix_hashes(PROMPT, 16)), 8)

        def placement(decode: WorkerView = decode, prefill: list[WorkerView] = prefill
                      ) -> None:
            decide(len(PROMPT), decode, prefill, slo, cached={"p0": 256},
                   overhead_s={"p0": 0.01})

        row = {"prefill_candidates": n, "decide_us": _per_call_us(placement),
               "hash_and_rank_us": _per_call_us(baseline), "owners": len(owners)}
        rows.append(row)
        print(f"{n:3d} prefill workers: decide {row['decide_us']:6.1f} us per request "
              f"(prefix hashing + ranking, paid before: {row['hash_and_rank_us']:6.1f} us)",
              flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "placement_cost.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
