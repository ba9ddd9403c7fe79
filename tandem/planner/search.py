"""``tandem plan``'s search: the cheapest P:D split that keeps a workload inside its SLOs.

    sizing       tandem/planner/sizing.py's first guess from the token mix and the profiles
    grow         both pools x1.25 until the simulated attainment reaches the target
    shrink       binary search the fewest decode workers with the prefill pool fixed, then
                 the fewest prefill workers, then decode again (pools trade off weakly)
    colocated    the same for one pool of workers that prefill their own prompts
    goodput      for the winners: the highest rate (the same requests, arrivals rescaled)
                 at which attainment stays at the target, by bisection
    curves       attainment vs rate for the winners (the plot)

Every judgement is a simulation (tandem/planner/sim) of the whole trace on the whole cluster; the
analytic sizing only picks where to start. Attainment is assumed to fall as a pool shrinks or
the rate grows (true up to the simulator's noise, which is none: it is deterministic).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from tandem.placement.slo import Slo
from tandem.planner.profile import Profile
from tandem.planner.sim import ClusterSpec, Summary, simulate
from tandem.planner.sizing import Sizing, size_pools, token_mix
from tandem.planner.trace import TraceRequest

GROW = 1.25
MAX_GROW_ROUNDS = 12  # x1.25^12 ~ 14.5: beyond that the sizing (or the SLO) is off
RATE_BISECTIONS = 7


@dataclass(frozen=True, slots=True)
class PlanInputs:
    """What to plan for. ``colocated`` is the profile of a worker that prefills and decodes
    (on GPUs the decode profile; on a CPU box it may own more threads)."""

    prefill: Profile
    decode: Profile
    colocated: Profile
    trace: Sequence[TraceRequest]  # at the target rate
    slo: Slo
    attainment: float = 0.9  # share of requests inside both targets
    placement: str = "adaptive"  # the router's placement for the disaggregated candidates
    warmup_s: float = 0.0  # requests arriving earlier are not scored


@dataclass(slots=True)
class Candidate:
    """One evaluated configuration."""

    kind: str  # "disaggregated" or "colocated"
    prefill: int
    decode: int
    gpus: int
    summary: Summary
    feasible: bool
    goodput_rps: float | None = None  # highest rate meeting the attainment target
    curve: list[tuple[float, float]] = field(default_factory=list)  # (rate, attainment)


@dataclass(slots=True)
class Plan:
    """The search's answer."""

    rate: float
    sizing: Sizing
    disaggregated: Candidate | None  # cheapest feasible disaggregated split
    colocated: Candidate | None  # cheapest feasible colocated pool
    evaluated: list[Candidate]
    simulations: int
    wall_s: float


class _Evaluator:
    """Simulates (and remembers) configurations of one plan."""

    def __init__(self, inputs: PlanInputs, progress: Callable[[str], None]) -> None:
        self.inputs = inputs
        self.progress = progress
        self.cache: dict[tuple[str, int, int, float], Candidate] = {}
        self.simulations = 0

    def gpus(self, prefill: int, decode: int, kind: str) -> int:
        i = self.inputs
        per_decode = (i.colocated if kind == "colocated" else i.decode).gpus_per_worker
        return prefill * i.prefill.gpus_per_worker + decode * per_decode

    def run(self, kind: str, prefill: int, decode: int, rate_factor: float = 1.0) -> Candidate:
        key = (kind, prefill, decode, rate_factor)
        if key in self.cache:
            return self.cache[key]
        i = self.inputs
        trace = i.trace if rate_factor == 1.0 else [
            replace(r, arrival_s=r.arrival_s / rate_factor) for r in i.trace]
        if kind == "colocated":
            spec = ClusterSpec(0, decode, placement="local", slo=i.slo)
            result = simulate(spec, i.colocated, trace)
        else:
            spec = ClusterSpec(prefill, decode, placement=i.placement, slo=i.slo)
            result = simulate(spec, i.decode, trace, prefill_profile=i.prefill)
        self.simulations += 1
        assert result.leaked_blocks == 0, f"simulator leaked {result.leaked_blocks} blocks"
        summary = result.summary(i.slo, i.warmup_s / rate_factor)
        cand = Candidate(kind, prefill, decode, self.gpus(prefill, decode, kind), summary,
                         summary.slo_attainment >= i.attainment)
        self.progress(f"  {kind:13s} P={prefill:<4d} D={decode:<4d} x{rate_factor:<5.2f} "
                      f"attainment {summary.slo_attainment:6.1%}  ({result.wall_s:.1f} s)")
        self.cache[key] = cand
        return cand


def _grow(ev: _Evaluator, kind: str, p: int, d: int) -> tuple[int, int] | None:
    for _ in range(MAX_GROW_ROUNDS):
        if ev.run(kind, p, d).feasible:
            return p, d
        p = max(p + 1, math.ceil(p * GROW)) if kind != "colocated" else 0
        d = max(d + 1, math.ceil(d * GROW))
    return None


def _fewest(ok: Callable[[int], bool], lo: int, hi: int, steps: int = 64) -> int:
    """The smallest n in [lo, hi] with ok(n), given ok(hi) and monotone ok (within
    ``steps`` bisection steps: then the smallest n known to pass)."""
    while lo < hi and steps > 0:
        steps -= 1
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


def _shrink(ev: _Evaluator, kind: str, p: int, d: int) -> tuple[int, int]:
    if kind == "colocated":
        return 0, _fewest(lambda n: ev.run(kind, 0, n).feasible, 1, d)
    def fewest_decode(p: int, d: int) -> int:
        return _fewest(lambda n: ev.run(kind, p, n).feasible, 1, d)

    def fewest_prefill(p: int, d: int) -> int:
        return _fewest(lambda n: ev.run(kind, n, d).feasible, 1, p)

    for _ in range(2):
        d = fewest_decode(p, d)
        p = fewest_prefill(p, d)
    return p, fewest_decode(p, d)


def goodput(ev: _Evaluator, cand: Candidate, rate: float) -> float:
    """The highest rate (requests/s) at which ``cand`` keeps the attainment target, to
    within 2^-RATE_BISECTIONS of the bracket, by rescaling the trace's arrivals."""
    def ok(factor: float) -> bool:
        return ev.run(cand.kind, cand.prefill, cand.decode, factor).feasible

    lo, hi = 0.0, 1.0
    if ok(1.0):
        lo, hi = 1.0, 2.0
        while ok(hi) and hi < 64:
            lo, hi = hi, hi * 2
    else:
        hi, lo = 1.0, 0.5
        while not ok(lo) and lo > 1 / 64:
            hi, lo = lo, lo / 2
        if not ok(lo):
            return 0.0
    for _ in range(RATE_BISECTIONS):
        mid = round((lo + hi) / 2, 6)
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo * rate


def thin(trace: Sequence[TraceRequest], keep: float, seed: int = 0) -> list[TraceRequest]:
    """A random ``keep`` share of the trace (whole conversations kept or dropped together):
    thinning a Poisson process gives a Poisson process at ``keep`` x the rate."""
    out = []
    for i, r in enumerate(trace):
        key = f"{seed}-c{r.conversation}" if r.conversation >= 0 else f"{seed}-{i}"
        if random.Random(key).random() < keep:
            out.append(r)
    return out


def _search(inputs: PlanInputs, ev: _Evaluator, sizing: Sizing, rate: float,
            curve_factors: Sequence[float]) -> dict[str, Candidate | None]:
    winners: dict[str, Candidate | None] = {}
    progress = ev.progress
    for kind, p0, d0 in (("disaggregated", sizing.prefill, sizing.decode),
                         ("colocated", 0, sizing.colocated)):
        progress(f"{kind}: grow until feasible, then shrink")
        grown = _grow(ev, kind, p0, d0)
        if grown is None:
            winners[kind] = None
            continue
        p, d = _shrink(ev, kind, *grown)
        winners[kind] = ev.run(kind, p, d)
    for cand in winners.values():
        if cand is None:
            continue
        progress(f"{cand.kind}: goodput and attainment curve of P={cand.prefill} "
                 f"D={cand.decode}")
        cand.goodput_rps = goodput(ev, cand, rate)
        cand.curve = [(f * rate, ev.run(cand.kind, cand.prefill, cand.decode, f)
                       .summary.slo_attainment) for f in curve_factors]
    return winners


def _scale_up(full: _Evaluator, cand: Candidate, k: float, trim_steps: int) -> Candidate:
    """A cell's winner at k x its size, checked on the whole trace: grown while it misses,
    then, with ``trim_steps`` > 0, each pool trimmed by up to 20% (that many bisection steps,
    a whole-trace simulation each) while it still meets the target: pooling usually makes
    the whole cluster do better than its cells."""
    p = math.ceil(cand.prefill * k) if cand.kind == "disaggregated" else 0
    d = math.ceil(cand.decode * k)
    full.progress(f"{cand.kind}: the cell's P={cand.prefill} D={cand.decode} x{k:.2f} on the "
                  "whole trace")
    grown = _grow(full, cand.kind, p, d)
    if grown is not None and trim_steps > 0:  # the cell is pessimistic: trim the whole pool
        p, d = grown
        d = _fewest(lambda n: full.run(cand.kind, p, n).feasible, math.floor(d * 0.8) or 1, d,
                    trim_steps)
        if cand.kind == "disaggregated":
            p = _fewest(lambda n: full.run(cand.kind, n, d).feasible,
                        math.floor(p * 0.8) or 1, p, trim_steps)
    elif grown is not None:
        p, d = grown
    big = full.run(cand.kind, p, d)
    big.goodput_rps = None if cand.goodput_rps is None else cand.goodput_rps * k
    big.curve = [(r * k, a) for r, a in cand.curve]
    return big


def plan(inputs: PlanInputs, progress: Callable[[str], None] = lambda _: None,
         curve_factors: Sequence[float] = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0),
         max_cell_workers: int = 48, trim_steps: int = 0) -> Plan:
    """Search for the cheapest disaggregated and colocated configurations (module docstring).

    A deployment the sizing puts above ``max_cell_workers`` is searched on a cell: the
    trace thinned to 1/k of its requests (k = sized workers / max_cell_workers), the cell's
    winners scaled by k, then simulated on the whole trace: grown if they miss (and with
    ``trim_steps``, trimmed by up to 20% per pool if they have room).
    Goodput and curves are the cell's, times k. This is where the planner aggregates: the
    cell has the full cluster's per-worker load but fewer workers to balance it over, so it
    is, if anything, pessimistic.
    """
    started = time.perf_counter()
    mix = token_mix(inputs.trace)
    sizing = size_pools(mix, inputs.prefill, inputs.decode, inputs.slo.tpot_s)
    progress(f"sizing from the token mix: P={sizing.prefill} D={sizing.decode} "
             f"colocated={sizing.colocated} ({mix.rate:.2f} req/s)")
    full = _Evaluator(inputs, progress)
    k = max(sizing.prefill + sizing.decode, sizing.colocated) / max_cell_workers
    if k <= 1.5:
        winners = _search(inputs, full, sizing, mix.rate, curve_factors)
        cell_sims = 0
    else:
        cell_trace = thin(inputs.trace, 1 / k)
        cell_mix = token_mix(cell_trace)
        cell_sizing = size_pools(cell_mix, inputs.prefill, inputs.decode, inputs.slo.tpot_s)
        progress(f"searching a 1/{k:.1f} cell ({len(cell_trace)} requests, "
                 f"{cell_mix.rate:.2f} req/s)")
        cell = _Evaluator(replace(inputs, trace=cell_trace), progress)
        found = _search(cell.inputs, cell, cell_sizing, cell_mix.rate, curve_factors)
        winners = {kind: None if c is None else
                   _scale_up(full, c, mix.rate / cell_mix.rate, trim_steps)
                   for kind, c in found.items()}
        cell_sims = cell.simulations
    evaluated = sorted((c for key, c in full.cache.items() if key[3] == 1.0),
                       key=lambda c: (not c.feasible, c.gpus, c.kind))
    return Plan(mix.rate, sizing, winners["disaggregated"], winners["colocated"], evaluated,
                full.simulations + cell_sims, time.perf_counter() - started)
