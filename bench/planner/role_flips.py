"""``coupled`` with role flips against ``coupled`` without, at 1,000-GPU scale, in the simulator.

    python -m bench.planner.role_flips --out docs/bench

The same setting as bench/planner/autoscale_policies.py (Llama-3.1-70B on 2 x H200 per
worker, roofline; the mixed lengths x 8; SLO TTFT 2 s, TPOT 50 ms per request; cold
workers join 60 s after the decision; pools 8..400; its shared stabilizer settings) and its
two traces (diurnal: mean --rate, peak/trough 4, one period over --duration; bursty: MMPP
at 0.5x and 1.5x --rate, 60 s mean dwell), plus one whose token mix shifts at a steady
request rate:

    mixshift   Poisson at --rate; a request is RAG (6-8k-token prompts, 128-256 out) with
               probability 0.1 at t = 0 and the end, 0.6 at half-time (a cosine between),
               else chat (256-768 in, 512-1,024 out): prompt tokens/s x3.8 and output
               tokens/s x0.6 from the ends to the middle, and back

Variants, only the flip settings differ:

    coupled            flip.enabled false
    flips              flip.enabled, flip_s --flip-s (a flipped worker serves its new role
                       this long after it is empty), a decode worker's streams moved by live
                       migration (their KV over the profile's link)
    flips-reprefill    the same, the streams re-prefilled elsewhere (no live migration)

Reported per trace and variant: SLO attainment, GPU-hours (every worker from its start to
its end; a flipped worker's GPUs counted once), flips, streams moved live and the KV bytes
they moved, scale events, TTFT/TPOT p90, peak pools. "flips (to P, swaps)": all flips, those
to prefill, and those that were swaps (tandem/autoscaler/flips.py). Writes ``role_flips.md`` (the table,
this command, the plot) and ``role_flips.png`` (GPUs held over time, and the decode pool
with the flips, per trace) under ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from bench.planner.autoscale_policies import (
    SHARED,
    SLO,
    config_for,
    make_trace,
    peak_and_start,
    sizing_at,
    timeline,
    worker_profile,
)
from tandem.autoscaler.config import FlipSettings
from tandem.common.request_shapes import CHAT, RAG
from tandem.loadgen.workload import scaled
from tandem.planner.autoscale import policy_row, simulate_autoscaled
from tandem.planner.sim import ClusterSpec
from tandem.planner.trace import TraceRequest

TRACES = ("diurnal", "bursty", "mixshift")
VARIANTS = ("coupled", "flips", "flips-reprefill")
RAG_SHARE = (0.1, 0.6)  # mixshift: RAG's share at the ends and at half-time


def mixshift(rate: float, duration_s: float, seed: int = 0) -> list[TraceRequest]:
    """Poisson arrivals at ``rate``, RAG's share following a cosine from RAG_SHARE[0] at
    the ends to RAG_SHARE[1] at half-time (the module docstring)."""
    rng = random.Random(seed)
    rag, chat = scaled(RAG, 8.0), scaled(CHAT, 8.0)
    lo, hi = RAG_SHARE
    out: list[TraceRequest] = []
    t = rng.expovariate(rate)
    while t < duration_s:
        share = lo + (hi - lo) * (1 - math.cos(2 * math.pi * t / duration_s)) / 2
        kind = rag if rng.random() < share else chat
        out.append(TraceRequest(arrival_s=t, prompt_tokens=rng.randint(*kind.prompt_tokens),
                                output_tokens=rng.randint(*kind.output_tokens),
                                kind=kind.name))
        t += rng.expovariate(rate)
    return out


def trace_of(kind: str, rate: float, duration_s: float) -> list[TraceRequest]:
    """One of TRACES."""
    return mixshift(rate, duration_s) if kind == "mixshift" else make_trace(kind, rate,
                                                                             duration_s)


def run_one(kind: str, variant: str, rate: float, duration_s: float, startup_s: float,
            flip_s: float) -> dict[str, Any]:
    """One variant on one trace: its row, flips and pools over time (a process's job)."""
    profile = worker_profile()
    trace = trace_of(kind, rate, duration_s)
    if kind == "mixshift":
        start = sizing_at(trace[:len(trace) // 20], rate, profile)  # the chat-heavy start
        at_peak = start
    else:
        peak, first = peak_and_start(kind, rate)
        at_peak, start = sizing_at(trace, peak, profile), sizing_at(trace, first, profile)
    cluster = ClusterSpec(start.prefill, start.decode, slo=SLO,
                          live_migration=variant != "flips-reprefill")
    config = dataclasses.replace(
        config_for("coupled", at_peak, startup_s, profile.max_num_seqs),
        flip=FlipSettings(enabled=variant != "coupled", flip_s=flip_s))
    run = simulate_autoscaled(cluster, profile, trace, config, startup_s=startup_s)
    row = dataclasses.asdict(policy_row(variant, run, SLO))
    return {"trace": kind, "variant": variant, "row": row, "flips": len(run.flips),
            "to_prefill": sum(1 for f in run.flips if f.target == "prefill"),
            "swaps": sum(1 for f in run.flips if f.move == "swap"),
            "live": run.sim.live_migrations, "moved_gb": run.sim.migrated_bytes / 1e9,
            "reprefilled": run.sim.migrations - run.sim.live_migrations,
            "flip_t": [f.t for f in run.flips],
            "timeline": timeline(run, trace), "start": [start.prefill, start.decode]}


def table(results: Sequence[dict[str, Any]]) -> str:
    """The markdown table of every run."""
    head = ("| trace | variant | attainment | GPU-h | flips (to P, swaps) | moved live | "
            "KV moved | re-prefilled | scales | TTFT p90 | TPOT p90 | peak P | peak D |")
    lines = [head, "|" + "---|" * 13]
    for r in results:
        row = r["row"]
        lines.append(
            f"| {r['trace']} | {r['variant']} | {row['attainment']:.3f} | "
            f"{row['gpu_hours']:.2f} | {r['flips']} ({r['to_prefill']}, {r['swaps']}) | "
            f"{r['live']} | "
            f"{r['moved_gb']:.1f} GB | {r['reprefilled']} | {row['scale_events']} | "
            f"{row['ttft_p90_s']:.3f} s | {row['tpot_p90_s'] * 1e3:.1f} ms | "
            f"{row['peak_prefill']} | {row['peak_decode']} |")
    return "\n".join(lines)


def plot(results: Sequence[dict[str, Any]], path: Path, gpus_per_worker: int) -> None:
    """Per trace: GPUs held over time per variant beside the offered rate (top), and the
    decode pool with a tick at each flip (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k in TRACES if any(r["trace"] == k for r in results)]
    fig, axes = plt.subplots(2, len(kinds), figsize=(5.6 * len(kinds), 7.5), squeeze=False)
    styles = {"coupled": ("tab:blue", "-"), "flips": ("tab:green", "-"),
              "flips-reprefill": ("tab:olive", "--")}
    for col, kind in enumerate(kinds):
        top, bottom = axes[0][col], axes[1][col]
        rate_ax = top.twinx()
        for i, res in enumerate(r for r in results if r["trace"] == kind):
            tl = res["timeline"]
            color, line = styles[res["variant"]]
            held = [(p + d) * gpus_per_worker
                    for p, d in zip(tl["prefill"], tl["decode"], strict=True)]
            top.plot(tl["t"], held, color=color, ls=line, label=res["variant"])
            bottom.plot(tl["t"], tl["decode"], color=color, ls=line, label=res["variant"])
            if res["flip_t"]:
                bottom.plot(res["flip_t"], [0.03 + 0.05 * i] * len(res["flip_t"]), "|", color=color,
                            ms=10, transform=bottom.get_xaxis_transform(), clip_on=False)
            if i == 0:
                rate_ax.plot(tl["t"], tl["rate"], color="black", alpha=0.2, lw=1)
                rate_ax.set_ylabel("offered requests/s (grey)")
        top.set_title(f"{kind}: GPUs held")
        bottom.set_title(f"{kind}: decode workers held (ticks: flips)")
        for ax in (top, bottom):
            ax.set_xlabel("simulated seconds")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, loc="upper left")
        top.set_ylabel("GPUs")
        bottom.set_ylabel("workers")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    """Run every variant on every trace; print the table; write the page and plot."""
    p = argparse.ArgumentParser(prog="python -m bench.planner.role_flips",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=300.0, help="mean requests/s")
    p.add_argument("--duration", type=float, default=600.0, help="simulated seconds")
    p.add_argument("--startup-s", type=float, default=60.0, help="a cold worker's start-up")
    p.add_argument("--flip-s", type=float, default=10.0,
                   help="a flip: empty worker to serving its new role")
    p.add_argument("--jobs", type=int, default=1, help="simulations run side by side")
    p.add_argument("--traces", default=",".join(TRACES))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", default=None, help="directory for role_flips.md and .png")
    args = p.parse_args(argv)
    kinds = [x for x in args.traces.split(",") if x]
    variants = [x for x in args.variants.split(",") if x]
    if not set(kinds) <= set(TRACES) or not set(variants) <= set(VARIANTS) \
            or args.rate <= 0 or args.flip_s < 0:
        p.error(f"traces from {TRACES}, variants from {VARIANTS}, --rate > 0, --flip-s >= 0")
    started = time.perf_counter()
    jobs = [(k, v, args.rate, args.duration, args.startup_s, args.flip_s)
            for k in kinds for v in variants]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(run_one, *zip(*jobs, strict=True)))
    wall = time.perf_counter() - started
    text = table(results)
    print(text)
    print(f"\n{len(jobs)} simulations in {wall:.0f} s")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        gpus = worker_profile().gpus_per_worker
        plot(results, out / "role_flips.png", gpus)
        command = "python -m bench.planner.role_flips " + " ".join(
            [f"--rate {args.rate:g}", f"--duration {args.duration:g}",
             f"--startup-s {args.startup_s:g}", f"--flip-s {args.flip_s:g}",
             f"--traces {','.join(kinds)}", f"--variants {','.join(variants)}",
             f"--out {args.out}"])
        (out / "role_flips.md").write_text(page(text, command, args, wall, gpus))
        print(f"wrote {out}/role_flips.md and role_flips.png")
    return 0


def page(text: str, command: str, args: argparse.Namespace, wall: float, gpus: int) -> str:
    """docs/bench/role_flips.md: what ran, the table, the plot."""
    return f"""# Role flips in the coupled autoscaler (simulated)

`coupled` with role flips (`flip.enabled`: a worker switches prefill <-> decode with its
weights loaded, `tandem/autoscaler/flips.py`) against `coupled` without, in the planner's
simulator (`tandem/planner/sim`, `tandem/planner/autoscale.py`). Llama-3.1-70B on {gpus} x H200
per worker (roofline), SLO TTFT {SLO.ttft_s:g} s and TPOT {SLO.tpot_s * 1e3:g} ms per request,
mean {args.rate:g} requests/s over {args.duration:g} simulated seconds, cold workers join
{args.startup_s:g} s after the decision, a flipped one {args.flip_s:g} s after it is empty;
pools {SHARED.prefill.min}..{SHARED.prefill.max} each; a decision every
{SHARED.interval_s:g} s, cooldowns {SHARED.cooldown.up_s:g} s up and
{SHARED.cooldown.down_s:g} s down, a {SHARED.stabilization_s:g} s down-scale window, the
flip window {FlipSettings().window_s:g} s. Traces and variants: `bench/planner/role_flips.py`.
The simulator is deterministic: the same command gives the same table.

```
{command}
```

{text}

({wall:.0f} s of simulation on this machine.) GPU-hours count every worker from its start to
its end, starting and draining ones included; a flipped worker's GPUs once (its old role's
span ends at the flip, its new role's starts there). "KV moved": the bytes the live
migrations of flipped decode workers' streams sent; "re-prefilled": streams moved by
re-prefilling prompt + tokens sent.

![GPUs held and the decode pool over time](role_flips.png)

These are the simulator's figures. On a live cluster the autoscaler plans flips where its
actuator can flip (`Actuator.can_flip`): the Ray actuator can when every worker is one
process (each worker actor runs the runtime that serves either role, tandem/worker/dual/;
a tensor-parallel group keeps its role), flipping through the router's
RouterAdmin.FlipWorker (docs/ray.md); the Kubernetes actuator cannot (a pod belongs to one
role's Deployment). `tandem local --flippable` starts workers that flip on `tandem flip`
but runs no autoscaler; docs/bench/flip_mixshift.md measures flips there under a mix
shift, chosen by an explicit mix policy.
"""


if __name__ == "__main__":
    raise SystemExit(main())
