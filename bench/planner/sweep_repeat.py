"""How well does a real run agree with itself? Two sweeps of the same commands, point by point.

    python -m bench.planner.sweep_repeat FIRST/serve_sweep.json REPEAT/serve_sweep.json

bench/planner_validation sets the simulator's figures beside one real run's and counts those
within 15%. A real run repeated on the same host, with the same code, commands and seeds,
does not reproduce its own figures exactly either: a point is 60 requests, its p90 the sixth
worst, and this VM's speed drifts from one half hour to the next. This prints the second
sweep's figures over the first's for every point both ran (TTFT p50/p90, TPOT p50/p90,
output tokens/s: the validation's), marks those outside the tolerance and counts the rest,
leaving out the point the validation calibrates at (``--skip``, default ``chat@0.3``), so the
count is the one the simulator's is compared with: the floor set by the runs themselves.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.planner.validation_tables import KEYS, METRICS, within


def _figures(point: dict[str, Any]) -> dict[str, float]:
    out = {name: point[group][pct] for name, group, pct, _ in METRICS}
    return out | {"output_tok_s": point["output_tok_s"]}


def repeat_rows(first: dict[str, Any], second: dict[str, Any], skip: str | None = "chat@0.3"
                ) -> list[dict[str, Any]]:
    """Per (setup, point) both sweeps ran, but ``skip`` (``MIX@RATE``; None for none): each
    figure's ``{"first", "second", "ratio"}`` (second / first)."""
    mix, _, rate = (skip or "").partition("@")
    rows = []
    for setup, points in first["summaries"].items():
        again = second["summaries"].get(setup, {})
        for label, point in points.items():
            if label not in again or "ttft" not in point:
                continue
            if skip and point["mix"] == mix and abs(point["rate"] - float(rate)) < 1e-9:
                continue
            a, b = _figures(point), _figures(again[label])
            row: dict[str, Any] = {"setup": setup, "mix": point["mix"], "rate": point["rate"]}
            for key in KEYS:
                row[key] = {"first": a[key], "second": b[key],
                            "ratio": b[key] / a[key] if a[key] > 0 else float("inf")}
            rows.append(row)
    return rows


def repeat_table(rows: list[dict[str, Any]], tolerance: float) -> str:
    """second / first per figure, a * where outside the tolerance, and the count."""
    lines = [f"{'setup':14s} {'mix':6s} {'rate':>5s} " + " ".join(f"{k:>13s}" for k in KEYS)]
    for r in rows:
        lines.append(f"{r['setup']:14s} {r['mix']:6s} {r['rate']:5.2f} " + " ".join(
            f"{r[k]['ratio']:12.2f}{'*' if abs(r[k]['ratio'] - 1) > tolerance else ' '}"
            for k in KEYS))
    lines.append(f"within {tolerance:.0%}: {within(rows, tolerance)} of {len(rows) * len(KEYS)}"
                 " figures (* marks the others; ratio = second run / first run)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.planner.sweep_repeat", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("first", type=Path, help="serve_sweep.json of the first run")
    p.add_argument("second", type=Path, help="serve_sweep.json of its repeat")
    p.add_argument("--tolerance", type=float, default=0.15)
    p.add_argument("--skip", default="chat@0.3",
                   help="MIX@RATE point left out (the validation's calibration point), or none")
    args = p.parse_args(argv)
    skip = None if args.skip == "none" else args.skip
    if skip is not None and "@" not in skip:
        p.error(f"--skip: MIX@RATE or none, not {args.skip!r}")
    rows = repeat_rows(json.loads(args.first.read_text()), json.loads(args.second.read_text()),
                       skip)
    if not rows:
        p.error("the two sweeps have no point in common")
    print(repeat_table(rows, args.tolerance))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
