"""The ``coupled`` policy on synthetic snapshots: pools from the token mix and fitted step
costs, latency misses charged to the pool that causes them, hysteresis, the demand's trend,
and safe drains (decode scale-down names the lightest workers; a prefill worker holding
leased KV is never drained)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import pytest

from tandem.autoscaler.autoscaler import Autoscaler
from tandem.autoscaler.config import AutoscaleConfig, Bounds, Cooldown, CoupledTargets, MaxStep
from tandem.autoscaler.decision import Decision
from tandem.autoscaler.flips import Flip
from tandem.autoscaler.metrics import RouterSample, Snapshot, WorkerSample
from tandem.placement.slo import ITL_BUCKETS, TTFT_BUCKETS

# Prefill: 20 ms a step + 0.1 ms a token, 2,048-token chunks: 2048 / 0.2248 = 9,110 tokens/s,
# 6,377 at the 70% busy share. Decode: 20 ms + 0.5 ms a row; a step may take 80 ms of the
# 100 ms TPOT target: 120 rows (of 128 at most), 120 / 0.08 = 1,500 tokens/s.
P_BASE, P_TOKEN, CHUNK = 0.02, 0.0001, 2048
D_BASE, D_ROW = 0.02, 0.0005
P_RATE = CHUNK / (P_BASE + P_TOKEN * CHUNK) * 0.7
D_RATE = 120 / (D_BASE + D_ROW * 120)

CFG = AutoscaleConfig(
    policy="coupled", interval_s=1, window_s=4, tolerance=0.1, stabilization_s=10,
    cooldown=Cooldown(up_s=2, down_s=4), max_step=MaxStep(up=50, down=50),
    prefill=Bounds(1, 64), decode=Bounds(1, 64),
    coupled=CoupledTargets(ttft_p90_s=2.0, tpot_p90_s=0.1, lead_s=10, trend_s=20,
                           max_rows=128),
)


@dataclass
class Load:
    """One second of load: demand, latency as the router sees it, decode pool state."""

    prompt_tps: float = 0.0
    requests_ps: float = 0.0
    output_per_request: float = 100.0
    streamed_tps: float | None = None  # tokens streamed (default: requests x output)
    ttft_s: float | None = 1.0  # every request's TTFT this second (None: no request)
    tpot_s: float | None = 0.05
    kv: float = 0.3
    waiting: float = 0.0
    leased: dict[str, int] = field(default_factory=dict)  # prefill worker -> leased blocks
    streams: dict[str, int] = field(default_factory=dict)  # decode worker -> running rows
    costs: bool = True  # workers report fitted step costs


class Cluster:
    """A cluster whose pools follow the autoscaler's decisions (new workers serve after
    ``startup_s``, at once by default; a decrease removes the decision's victims, then the
    newest starting, then the newest; with ``can_flip`` a flipped worker moves to its new role at once), fed a load
    per second."""

    def __init__(self, config: AutoscaleConfig = CFG, prefill: int = 4, decode: int = 4,
                 can_flip: bool = False, startup_s: float = 0.0) -> None:
        self.scaler = Autoscaler(config)
        self.can_flip = can_flip
        self.startup_s = startup_s
        self.ready_at: dict[str, float] = {}  # starting workers: when they serve
        self.flips: list[Flip] = []
        self.ids = {"prefill": [f"p{i}" for i in range(prefill)],
                    "decode": [f"d{i}" for i in range(decode)]}
        self._next = {"prefill": prefill, "decode": decode}
        self.t = 0.0
        self.router = RouterSample(ttft=_empty(TTFT_BUCKETS), tpot=_empty(ITL_BUCKETS))
        self.decisions: list[Decision] = []
        self.history: list[dict[str, int]] = []

    @property
    def current(self) -> dict[str, int]:
        return {role: len(ids) for role, ids in self.ids.items()}

    def _apply(self, d: Decision) -> None:
        ids = self.ids[d.role]
        for victim in d.victims:
            ids.remove(victim)
        while len(ids) > d.desired:  # workers still starting first, the newest first
            starting = [w for w in ids if self.ready_at.get(w, 0.0) > self.t]
            ids.remove(starting[-1] if starting else ids[-1])
        while len(ids) < d.desired:
            ids.append(f"{d.role[0]}{self._next[d.role]}")
            self.ready_at[ids[-1]] = self.t + self.startup_s
            self._next[d.role] += 1

    def _flip(self, f: Flip) -> None:
        self.ids[f.source].remove(f.worker)
        self.ids[f.target].append(f.worker)

    def serving(self, role: str) -> list[str]:
        return [w for w in self.ids[role] if self.ready_at.get(w, 0.0) <= self.t]

    def tick(self, load: Load) -> dict[str, int]:
        self.t += 1.0
        workers = []
        for wid in self.serving("prefill"):
            workers.append(WorkerSample(
                "prefill", wid, leased_blocks=load.leased.get(wid, 0),
                num_running=1 if load.leased.get(wid) else 0,
                step_base_s=P_BASE if load.costs else None,
                step_per_prefill_token_s=P_TOKEN if load.costs else None,
                max_batched_tokens=CHUNK))
        for wid in self.serving("decode"):
            workers.append(WorkerSample(
                "decode", wid, num_running=load.streams.get(wid, 0),
                kv_cache_usage=load.kv, step_base_s=D_BASE if load.costs else None,
                step_per_row_s=D_ROW if load.costs else None))
        r, n = self.router, load.requests_ps
        streamed = n * load.output_per_request if load.streamed_tps is None \
            else load.streamed_tps
        self.router = RouterSample(
            ttft=_add(r.ttft, load.ttft_s, n), tpot=_add(r.tpot, load.tpot_s, n),
            prompt_tokens_total=r.prompt_tokens_total + load.prompt_tps,
            output_tokens_total=r.output_tokens_total + streamed,
            admitted_total=r.admitted_total + n, finished_total=r.finished_total + n,
            finished_tokens_total=r.finished_tokens_total + n * load.output_per_request,
            waiting=load.waiting)
        snap = Snapshot(self.t, tuple(workers), self.router)
        plan = self.scaler.plan(snap, self.current, self.can_flip)  # type: ignore[arg-type]
        decisions = plan.decisions
        for f in plan.flips:
            self._flip(f)
        self.flips += plan.flips
        for d in decisions:
            self._apply(d)
        self.decisions += decisions
        self.history.append(dict(self.current))
        return dict(self.current)

    def run(self, seconds: int, load: Load) -> dict[str, int]:
        for _ in range(seconds):
            self.tick(load)
        return dict(self.current)


def _empty(bounds: tuple[float, ...]) -> tuple[tuple[float, float], ...]:
    return tuple((b, 0.0) for b in (*bounds, math.inf))


def _add(hist: tuple[tuple[float, float], ...], value: float | None, n: float
         ) -> tuple[tuple[float, float], ...]:
    """``n`` more observations of ``value`` in a cumulative histogram."""
    if value is None or n <= 0:
        return hist
    return tuple((b, c + n if value <= b else c) for b, c in hist)


def steady(prompt_tps: float, output_tps: float, **kw: object) -> Load:
    """Demand at these token rates with requests of 100 output tokens, inside the SLO."""
    return Load(prompt_tps=prompt_tps, requests_ps=output_tps / 100, **kw)  # type: ignore[arg-type]


def test_pools_follow_the_token_mix_and_fitted_costs() -> None:
    c = Cluster()
    got = c.run(12, steady(60_000, 9_000))
    assert got == {"prefill": math.ceil(60_000 / P_RATE), "decode": math.ceil(9_000 / D_RATE)}
    assert got == {"prefill": 10, "decode": 6}
    last = {d.role: d for d in c.decisions[-2:]}
    assert last["prefill"].proposal.signal == "prompt_tokens_per_s"
    assert last["decode"].proposal.signal == "output_tokens_per_s"
    assert last["prefill"].inputs["router_prompt_tokens_per_s"] == pytest.approx(60_000)
    # The mix turns prompt-heavy: P:D follows it, both pools set in the same decisions.
    # (A step in demand reads as a ramp for a trend window: prefill overshoots, then comes
    # back once the window has been quiet.)
    got = c.run(80, steady(120_000, 3_000))
    assert got["decode"] == 2  # (prefill: 19, or 20 when it comes down within tolerance)
    assert math.ceil(120_000 / P_RATE) == 19 <= got["prefill"] <= 20


def test_decode_pool_scales_down_naming_the_lightest_workers() -> None:
    c = Cluster(prefill=10, decode=6)
    load = steady(60_000, 9_000, kv=0.1,
                  streams={"d0": 40, "d1": 3, "d2": 35, "d3": 30, "d4": 1, "d5": 38})
    assert c.run(12, load) == {"prefill": 10, "decode": 6}
    # Output demand falls to a third: decode shrinks to 2 after the down-scale window, the
    # workers with the fewest streams go first (they drain or migrate the least).
    load.requests_ps = 30.0
    got = c.run(20, load)
    assert got["decode"] == 2 and got["prefill"] == 10
    downs = [d for d in c.decisions if d.role == "decode" and d.direction == "down"]
    assert downs and downs[0].t >= 12 + CFG.stabilization_s
    assert sum(d.current - d.desired for d in downs) == 4
    assert [v for d in downs for v in d.victims] == ["d4", "d1", "d3", "d2"]
    assert c.ids["decode"] == ["d0", "d5"]


def test_steady_and_oscillating_load_do_not_flap() -> None:
    c = Cluster(prefill=9, decode=6)
    for i in range(40):  # +-4% wobble about 8.5 and 5.6 workers' worth
        k = 1.04 if i % 2 else 0.96
        c.tick(steady(54_000 * k, 8_400 * k))
    assert all(h == {"prefill": 9, "decode": 6} for h in c.history)
    for i in range(60):  # peaks every other second: the window sees their mean and holds
        c.tick(steady(120_000, 18_000) if i % 2 == 0 else steady(6_000, 900))
    for role in ("prefill", "decode"):
        counts = [h[role] for h in c.history[40:]]
        moves = [b - a for a, b in zip(counts, counts[1:], strict=False) if a != b]
        reversals = sum(1 for a, b in zip(moves, moves[1:], strict=False) if a * b < 0)
        assert reversals <= 1, f"{role} flapped: {counts}"  # up once, then down in steps
        assert len(set(counts[-25:])) == 1, f"{role} did not settle: {counts}"


def test_prefill_worker_holding_leased_kv_is_never_drained() -> None:
    c = Cluster(prefill=4, decode=2)
    # Demand for one prefill worker; p0 and p2 hold leased KV (their pushes in progress).
    load = steady(5_000, 1_500, leased={"p0": 12, "p2": 3})
    c.run(30, load)
    prefill = [d for d in c.decisions if d.role == "prefill"]
    assert c.ids["prefill"] == ["p0", "p2"]
    first = next(d for d in prefill if d.changed)
    assert (first.current, first.desired, first.proposal.replicas) == (4, 2, 1)
    assert first.reason == "step: leased KV" and set(first.victims) == {"p1", "p3"}
    assert prefill[-1].reason == "hold: leased KV" and prefill[-1].desired == 2
    # Once p2's push is done it may go; p0, still leasing, stays.
    load.leased = {"p0": 5}
    c.run(6, load)
    assert c.ids["prefill"] == ["p0"]
    assert [d.victims for d in c.decisions if d.role == "prefill" and d.changed][-1] == ("p2",)


def test_ttft_miss_grows_prefill_beyond_the_model_and_never_shrinks_it() -> None:
    c = Cluster(prefill=10, decode=6)
    c.run(12, steady(60_000, 9_000))
    c.run(12, steady(60_000, 9_000, ttft_s=6.0))  # p90 ~4.9 s against 2 s: prefill's miss
    assert c.current["prefill"] > 10 and c.current["decode"] == 6
    assert c.scaler._policy.gain["prefill"] > 1.0  # type: ignore[attr-defined]
    # Demand halves while TTFT still misses: prefill holds, it does not shrink.
    c.run(20, steady(30_000, 9_000, ttft_s=6.0))
    assert c.current["prefill"] > 10
    assert "latency over target" in [d for d in c.decisions if d.role == "prefill"][-1] \
        .proposal.signal


def test_ttft_miss_is_the_decode_pools_when_requests_wait_for_decode_room() -> None:
    c = Cluster(prefill=10, decode=6)
    c.run(12, steady(60_000, 9_000))
    c.run(12, steady(60_000, 9_000, ttft_s=6.0, waiting=40, kv=0.95))
    assert c.current["prefill"] == 10
    assert c.current["decode"] > 6
    policy = c.scaler._policy  # type: ignore[attr-defined]
    assert policy.gain["prefill"] == 1.0 and policy.gain["decode"] > 1.0


def test_tpot_miss_grows_decode() -> None:
    c = Cluster(prefill=10, decode=6)
    c.run(12, steady(60_000, 9_000))
    c.run(12, steady(60_000, 9_000, tpot_s=0.3))
    assert c.current["decode"] > 6 and c.current["prefill"] == 10


def test_rising_demand_is_met_ahead_by_its_trend() -> None:
    flat, rising = Cluster(prefill=1, decode=1), Cluster(prefill=1, decode=1)
    for i in range(20):  # prompt demand climbs 2,000 tokens/s every second
        rising.tick(steady(20_000 + 2_000 * i, 3_000))
        flat.tick(steady(20_000 + 2_000 * 19, 3_000))
    # Now 58,000 tokens/s; 14 s ahead (lead_s, half the window, the up cooldown) ~86,000:
    # 14 workers, not the 10 of now.
    assert flat.current["prefill"] == math.ceil(58_000 / P_RATE) == 10
    assert rising.current["prefill"] >= 12


def test_output_demand_counts_admissions_when_they_are_enough_or_streaming_is_capped() -> None:
    # 90 requests/s of 100 tokens want 9,000 tokens/s; the decode pool streams 3,000 (it
    # lags admissions, or it is full): 360 admissions a window are a steady measure.
    c = Cluster(prefill=10, decode=2)
    c.run(12, steady(60_000, 9_000, streamed_tps=3_000))
    assert c.current["decode"] == 6
    # 3 requests/s of 3,000 tokens (12 a window: bursty, the streamed rate stands)...
    few = Load(prompt_tps=60_000, requests_ps=3.0, output_per_request=3_000,
               streamed_tps=3_000)
    c = Cluster(prefill=10, decode=2)
    c.run(12, few)
    assert c.current["decode"] == 2
    # ... unless requests wait for decode room: streaming is capped, admissions count.
    few.waiting = 20
    c = Cluster(prefill=10, decode=2)
    c.run(12, few)
    assert c.current["decode"] == 6


def test_priors_until_the_workers_fit_then_latency_alone() -> None:
    no_costs = steady(60_000, 9_000, costs=False)
    priors = replace(CFG, coupled=replace(
        CFG.coupled, prefill_token_s=P_TOKEN, prefill_base_s=P_BASE, decode_base_s=D_BASE,
        decode_row_s=D_ROW))
    assert Cluster(priors).run(12, no_costs) == {"prefill": 10, "decode": 6}
    # No model at all: hold what serves until latency misses, then grow by the miss.
    blind = Cluster(prefill=3, decode=3)
    assert blind.run(12, no_costs) == {"prefill": 3, "decode": 3}
    no_costs.ttft_s = 6.0
    assert blind.run(6, no_costs)["prefill"] > 3


def test_idle_cluster_shrinks_to_min_only_after_the_window() -> None:
    c = Cluster(prefill=5, decode=5)
    c.tick(Load())  # the first decision: nothing measured yet
    assert c.current == {"prefill": 5, "decode": 5}
    c.run(30, Load())
    assert c.current == {"prefill": 1, "decode": 1}
    downs = [d for d in c.decisions if d.direction == "down"]
    assert min(d.t for d in downs) > CFG.stabilization_s
    assert {d.proposal.signal for d in downs} == {"idle"}
