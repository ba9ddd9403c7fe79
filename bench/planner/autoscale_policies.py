"""The autoscaler's policies on the same traces at 1,000-GPU scale, in the simulator.

    python -m bench.planner.autoscale_policies --out docs/bench/autoscale_policies

Every policy (``fixed``, ``queue``, ``slo``, ``coupled``) runs inside tandem/planner/sim through
tandem/planner/autoscale.py (the autoscaler's own window, policies, stabilizer and drain choice; the
router's own placement code) on the same traces, profile, SLO, bounds and stabilizer
settings; only ``policy`` differs. Reported per policy and trace: SLO attainment (requests
inside both the TTFT and the TPOT target), GPU-hours (every worker from its start to its
drain's end, starting and draining ones included), scale events, TTFT/TPOT p90, peak pools.

    model      Llama-3.1-70B, 2 x H200 per worker (TP=2), tandem/planner/roofline.py estimates
    workload   the bench's mixed lengths x 8 (30% RAG: 6-8k-token prompts, 128-256 out;
               70% chat: 256-768 in, 512-1,024 out)
    traces     diurnal: mean --rate, peak/trough 4, one period over --duration (the trough
               at t = 0, the peak at half-time); bursty: a two-state MMPP at 0.5x and 1.5x
               --rate, 60 s mean dwell
    SLO        TTFT 2 s, TPOT 50 ms (per request, as the simulator's summary measures)
    fixed      tandem/planner/sizing.py's first guess for the trace's peak rate, from t = 0
    autoscaled start at the first guess for the rate at t = 0; new workers join after
               --startup-s (a 70B worker loading its weights); pools 8..400 workers each

The settings every autoscaled policy shares (``SHARED``) are deploy/autoscale/slo.yaml's
(a decision every 5 s over a 30 s window, cooldowns of 15 s up and 60 s down, a 120 s
down-scale window) with steps for pools of hundreds (up to 100 workers added and 50 drained
per decision). The ``slo`` and ``queue`` policies keep their default constants (that is what
is compared); their latency targets are set to the SLO. ``coupled`` gets the SLO, the
profile's row cap and ``lead_s`` = the start-up; its other settings are its defaults.

Writes ``autoscale_policies.json`` (rows and per-policy pool sizes over time) and
``autoscale_policies.png`` (GPUs held over time against the request rate, and attainment
against GPU-hours) under ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from tandem.autoscaler.config import (
    AutoscaleConfig,
    Bounds,
    Cooldown,
    CoupledTargets,
    FixedCounts,
    MaxStep,
    SloTargets,
)
from tandem.loadgen.workload import scaled
from tandem.placement.slo import Slo
from tandem.planner import workload
from tandem.planner.autoscale import (
    AutoscaledResult,
    PolicyRow,
    format_rows,
    policy_row,
    simulate_autoscaled,
)
from tandem.planner.devices import get_device
from tandem.planner.models import get_model
from tandem.planner.profile import Profile
from tandem.planner.roofline import roofline_profile
from tandem.planner.sim import ClusterSpec
from tandem.planner.sizing import Sizing, size_pools, token_mix
from tandem.planner.trace import TraceRequest

POLICIES = ("fixed", "queue", "slo", "coupled")
TRACES = ("diurnal", "bursty")
SLO = Slo(ttft_s=2.0, tpot_s=0.05)
SHARED = AutoscaleConfig(
    policy="queue", interval_s=5.0, window_s=30.0, tolerance=0.1, stabilization_s=120.0,
    cooldown=Cooldown(up_s=15.0, down_s=60.0), max_step=MaxStep(up=100, down=50),
    prefill=Bounds(8, 400), decode=Bounds(8, 400),
    slo=SloTargets(ttft_p90_s=SLO.ttft_s, itl_mean_s=SLO.tpot_s),
)
PEAK_TO_TROUGH = 4.0
DWELL_S = 60.0


def worker_profile() -> Profile:
    """Llama-3.1-70B on two H200s per worker (roofline estimate)."""
    return roofline_profile(get_model("Llama-3.1-70B"), get_device("H200"), gpus_per_worker=2)


def make_trace(kind: str, rate: float, duration_s: float, seed: int = 0) -> list[TraceRequest]:
    """The ``diurnal`` or ``bursty`` trace of mean ``rate`` (see the module docstring)."""
    mix = workload.LengthMix("mixed8", tuple((scaled(k, 8.0), share)
                                             for k, share in workload.MIXED.kinds))
    if kind == "diurnal":
        return workload.diurnal(rate, PEAK_TO_TROUGH, duration_s, duration_s, mix, seed=seed)
    if kind == "bursty":
        return workload.mmpp((rate * 0.5, rate * 1.5), (DWELL_S, DWELL_S), duration_s, mix,
                             seed=seed)
    raise ValueError(f"unknown trace {kind!r}")


def peak_and_start(kind: str, rate: float) -> tuple[float, float]:
    """The trace's peak rate and its rate at t = 0 (bursty: the process's stationary mean)."""
    if kind == "diurnal":
        a = (PEAK_TO_TROUGH - 1) / (PEAK_TO_TROUGH + 1)
        return rate * (1 + a), rate * (1 - a)
    return rate * 1.5, rate


def sizing_at(trace: Sequence[TraceRequest], rate: float, profile: Profile) -> Sizing:
    """tandem/planner/sizing.py's first guess for ``trace``'s request mix at ``rate`` req/s."""
    mix = token_mix(trace)
    k = rate / mix.rate
    at = dataclasses.replace(mix, rate=rate, prompt_tokens_s=mix.prompt_tokens_s * k,
                             output_tokens_s=mix.output_tokens_s * k)
    return size_pools(at, profile, profile, SLO.tpot_s)


def config_for(policy: str, fixed: Sizing, startup_s: float, max_rows: int
               ) -> AutoscaleConfig:
    """SHARED with ``policy``, the fixed counts and the coupled policy's targets (the SLO,
    the workers' row cap, their start-up as the look-ahead)."""
    return dataclasses.replace(
        SHARED, policy=policy, fixed=FixedCounts(fixed.prefill, fixed.decode),
        coupled=CoupledTargets(ttft_p90_s=SLO.ttft_s, tpot_p90_s=SLO.tpot_s, lead_s=startup_s,
                               max_rows=max_rows))


def run_one(kind: str, policy: str, rate: float, duration_s: float, startup_s: float
            ) -> dict[str, Any]:
    """One policy on one trace: its row and its pools over time (a worker process's job)."""
    profile = worker_profile()
    trace = make_trace(kind, rate, duration_s)
    peak, start = peak_and_start(kind, rate)
    at_peak, at_start = sizing_at(trace, peak, profile), sizing_at(trace, start, profile)
    first = at_peak if policy == "fixed" else at_start
    cluster = ClusterSpec(first.prefill, first.decode, slo=SLO)
    config = config_for(policy, at_peak, startup_s, profile.max_num_seqs)
    run = simulate_autoscaled(cluster, profile, trace, config, startup_s=startup_s)
    row = policy_row(policy, run, SLO)
    return {"trace": kind, "row": dataclasses.asdict(row), "timeline": timeline(run, trace),
            "start": [first.prefill, first.decode]}


def timeline(run: AutoscaledResult, trace: Sequence[TraceRequest], step_s: float = 10.0
             ) -> dict[str, list[float]]:
    """Per ``step_s``: the request rate offered and the workers held per role."""
    end = run.sim.simulated_s
    times = [i * step_s for i in range(int(end // step_s) + 1)]
    arrivals = [0] * len(times)
    for r in trace:
        arrivals[min(int(r.arrival_s // step_s), len(times) - 1)] += 1
    return {"t": times, "rate": [n / step_s for n in arrivals],
            "prefill": [run.held("prefill", t) for t in times],
            "decode": [run.held("decode", t) for t in times]}


def plot(results: list[dict[str, Any]], path: Path, gpus_per_worker: int) -> None:
    """GPUs held over time per policy beside the offered rate (top), attainment against
    GPU-hours (bottom), one column per trace."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k in TRACES if any(r["trace"] == k for r in results)]
    fig, axes = plt.subplots(2, len(kinds), figsize=(6.2 * len(kinds), 8), squeeze=False)
    colors = {"fixed": "tab:gray", "queue": "tab:orange", "slo": "tab:red",
              "coupled": "tab:blue"}
    for col, kind in enumerate(kinds):
        top, bottom = axes[0][col], axes[1][col]
        rate_ax = top.twinx()
        shown_rate = False
        for res in (r for r in results if r["trace"] == kind):
            tl, row = res["timeline"], res["row"]
            held = [(p + d) * gpus_per_worker for p, d in zip(tl["prefill"], tl["decode"],
                                                              strict=True)]
            top.plot(tl["t"], held, color=colors[row["policy"]], label=row["policy"])
            if not shown_rate:
                rate_ax.plot(tl["t"], tl["rate"], color="black", alpha=0.25, lw=1)
                rate_ax.set_ylabel("offered requests/s (grey)")
                shown_rate = True
            bottom.scatter(row["gpu_hours"], row["attainment"] * 100, s=60,
                           color=colors[row["policy"]], label=row["policy"])
            bottom.annotate(row["policy"], (row["gpu_hours"], row["attainment"] * 100),
                            textcoords="offset points", xytext=(6, 4), fontsize=8)
        top.set_title(f"{kind}: GPUs held (starting, serving, draining)")
        top.set_xlabel("simulated seconds")
        top.set_ylabel("GPUs")
        top.grid(alpha=0.3)
        top.legend(fontsize=8, loc="upper left")
        bottom.set_title(f"{kind}: SLO attainment vs GPU-hours")
        bottom.set_xlabel("GPU-hours")
        bottom.set_ylabel(f"requests in TTFT {SLO.ttft_s:g} s and TPOT "
                          f"{SLO.tpot_s * 1e3:g} ms (%)")
        bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    """Run every policy on every trace, print the tables, write JSON and PNG to --out."""
    p = argparse.ArgumentParser(prog="python -m bench.planner.autoscale_policies",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=300.0, help="mean requests/s")
    p.add_argument("--duration", type=float, default=600.0, help="simulated seconds")
    p.add_argument("--startup-s", type=float, default=60.0, help="a new worker's start-up")
    p.add_argument("--jobs", type=int, default=2, help="simulations run side by side")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--traces", default=",".join(TRACES))
    p.add_argument("--out", default=None, help="directory for the JSON and PNG")
    args = p.parse_args(argv)
    policies = [x for x in args.policies.split(",") if x]
    kinds = [x for x in args.traces.split(",") if x]
    if not set(policies) <= set(POLICIES) or not set(kinds) <= set(TRACES) or args.rate <= 0:
        p.error(f"policies from {POLICIES}, traces from {TRACES}, --rate > 0")
    started = time.perf_counter()
    jobs = [(k, pol, args.rate, args.duration, args.startup_s) for k in kinds
            for pol in policies]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(run_one, *zip(*jobs, strict=True)))
    gpus = worker_profile().gpus_per_worker
    for kind in kinds:
        rows = [PolicyRow(**r["row"]) for r in results if r["trace"] == kind]
        print(f"\n{kind} (mean {args.rate:g} req/s, {args.duration:g} s; GPU-h at "
              f"{gpus} GPUs/worker):")
        print(format_rows(rows))
    wall = time.perf_counter() - started
    print(f"\n{len(jobs)} simulations in {wall:.0f} s")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        meta = {"rate": args.rate, "duration_s": args.duration, "startup_s": args.startup_s,
                "slo": {"ttft_s": SLO.ttft_s, "tpot_s": SLO.tpot_s},
                "gpus_per_worker": gpus, "shared_config": dataclasses.asdict(SHARED),
                "wall_s": round(wall, 1)}
        (out / "autoscale_policies.json").write_text(json.dumps(
            {"meta": meta, "results": results}, indent=1, default=_json_default) + "\n")
        plot(results, out / "autoscale_policies.png", gpus)
        print(f"wrote {out}/autoscale_policies.json and .png")
    return 0


def _json_default(value: object) -> object:
    if isinstance(value, float) and math.isinf(value):
        return str(value)
    raise TypeError(f"not JSON: {value!r}")


if __name__ == "__main__":
    raise SystemExit(main())
