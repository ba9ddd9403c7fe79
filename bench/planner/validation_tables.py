"""The planner validation's text tables (bench/planner/validation.py prints them): the
simulated figures over the measured ones, the workers' activity, the decode worker's served
steps against its profile."""

from __future__ import annotations

from typing import Any

from bench.serving.step_overlap import BAND_ROWS, alone_ratios
from tandem.planner.profile import Profile

# (figure, the sweep's group, its percentile, the simulator's Summary field)
METRICS = (("ttft_p50", "ttft", "p50", "ttft_p50_s"), ("ttft_p90", "ttft", "p90", "ttft_p90_s"),
           ("tpot_p50", "tpot", "p50", "tpot_p50_s"), ("tpot_p90", "tpot", "p90", "tpot_p90_s"))
KEYS = [m[0] for m in METRICS] + ["output_tok_s"]  # the figures compared


def within(rows: list[dict[str, Any]], tolerance: float) -> int:
    """How many of ``rows``' figures (``row[key]["ratio"]`` for each of KEYS) are within
    ``tolerance`` of 1."""
    return sum(abs(r[k]["ratio"] - 1) <= tolerance for r in rows for k in KEYS)


def _within_range(v: dict[str, Any], tolerance: float) -> bool:
    lo, hi = v.get("range", (v["ratio"], v["ratio"]))
    return lo <= 1 + tolerance and hi >= 1 - tolerance


def table(rows: list[dict[str, Any]], tolerance: float) -> str:
    """sim/real per metric, a * where outside the tolerance."""
    keys = KEYS
    head = f"{'setup':14s} {'mix':6s} {'rate':>5s} " + " ".join(f"{k:>13s}" for k in keys) \
        + f" {'attain real/sim':>16s}"
    lines = [head]
    for r in rows:
        if r.get("calibration"):
            lines.append(f"{r['setup']:14s} {r['mix']:6s} {r['rate']:5.2f} (cal: serving "
                         f"{r['serving_step_s'] * 1e3:.1f} ms/step, "
                         f"{r['serving_request_s'] * 1e3:.0f} ms/request)")
            continue
        cells = []
        for k in keys:
            ratio = r[k]["ratio"]
            cells.append(f"{ratio:12.2f}{'*' if abs(ratio - 1) > tolerance else ' '}")
        a = r["attainment"]
        lines.append(f"{r['setup']:14s} {r['mix']:6s} {r['rate']:5.2f} " + " ".join(cells)
                     + f" {a['real']:7.0%} / {a['sim']:4.0%}")
    tested = [r for r in rows if not r.get("calibration")]
    lines.append(f"within {tolerance:.0%}: {within(tested, tolerance)} of "
                 f"{len(tested) * len(keys)} figures "
                 "(* marks the others; ratio = simulated / measured)")
    if any("range" in r[k] for r in tested for k in keys):
        spread = sum(_within_range(r[k], tolerance) for r in tested for k in keys)
        lines.append(f"within {tolerance:.0%} for a decode factor in the sensitivity range: "
                     f"{spread} of {len(tested) * len(keys)}")
    return "\n".join(lines)


def worker_table(rows: list[dict[str, Any]]) -> str:
    """How busy the workers were, real / simulated, where the sweep recorded it: the decode
    worker's share of time stepping, its mean step and rows a step, the prefill worker's
    share."""
    lines = [f"{'setup':14s} {'mix':6s} {'rate':>5s} {'decode busy':>13s} "
             f"{'decode step ms':>16s} {'rows a step':>13s} {'prefill busy':>13s}"]
    for r in rows:
        w = r.get("workers")
        if w is None:
            continue
        busy, step, batch = w["decode_busy"], w["decode_step_s"], w["decode_rows"]
        pre = w.get("prefill_busy")
        lines.append(f"{r['setup']:14s} {r['mix']:6s} {r['rate']:5.2f} "
                     f"{busy['real']:5.0%} / {busy['sim']:4.0%} "
                     f"{1e3 * step['real']:7.1f} / {1e3 * step['sim']:6.1f} "
                     f"{batch['real']:5.1f} / {batch['sim']:5.1f} "
                     + (f"{pre['real']:5.0%} / {pre['sim']:4.0%}" if pre else f"{'-':>13s}"))
    return "\n".join(lines) if len(lines) > 1 else ""


def profile_table(served: list[tuple[str, str, float, dict[str, Any]]], profile: Profile) -> str:
    """The decode worker's served steps alone (no prefill step beside them) against
    ``profile`` (the engine alone, before calibration): per point and batch-size band, the
    steps' mean seconds over the profile's step at their mean rows and context."""
    names = list(BAND_ROWS)
    lines = [f"{'setup':14s} {'mix':6s} {'rate':>5s} " + " ".join(f"{n + ' rows':>10s}"
                                                                 for n in names)]
    for setup, mix, rate, o in served:
        ratios = alone_ratios(o, profile.step)
        lines.append(f"{setup:14s} {mix:6s} {rate:5.2f} " + " ".join(
            f"{ratios[n]:10.2f}" if n in ratios else f"{'-':>10s}" for n in names))
    return "\n".join(lines)
