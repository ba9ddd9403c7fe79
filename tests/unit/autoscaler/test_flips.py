"""Role flips of the ``coupled`` autoscaler on synthetic snapshots (fake clock: one tick a
second): a token mix shifting faster than a worker starts flips the lightest decode worker to
prefill; no flip without an actuator that can, when a cold start is as fast, before the
donor's surplus has lasted, against a cooldown, below a pool's minimum or of its last
worker; the observed start-up replaces the configured one."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace

import pytest

from tandem.autoscaler.actuators.k8s_actuator import KubernetesActuator
from tandem.autoscaler.actuators.ray_actuator import RayActuator
from tandem.autoscaler.config import Bounds, FlipSettings
from tandem.autoscaler.decision import Decision, Proposal
from tandem.autoscaler.exporter import DecisionExporter
from tandem.autoscaler.flips import Flip, FlipUnsupportedError, Forecast, StartClock
from tests.unit.autoscaler.test_coupled import CFG, Cluster, Load, steady

FLIP = replace(CFG, flip=FlipSettings(enabled=True, flip_s=2.0, window_s=3.0))  # lead_s 10
SHIFT_AT = 12.0  # the mix starts shifting after 12 steady seconds
STREAMS = {"d0": 30, "d1": 25, "d2": 28, "d3": 2, "d4": 26, "d5": 27, "d6": 29, "d7": 24}


def chat_to_rag(seconds: int = 80, ramp: int = 40) -> list[Load]:
    """Chat-heavy (25k prompt, 12k output tokens/s) turning RAG-heavy (50k, 6k) over
    ``ramp`` seconds."""
    loads = [steady(25_000, 12_000, streams=STREAMS) for _ in range(int(SHIFT_AT))]
    for i in range(seconds):
        k = min(i, ramp) / ramp
        loads.append(steady(25_000 + 25_000 * k, 12_000 - 6_000 * k, streams=STREAMS))
    return loads


def run(loads: list[Load], config: object = FLIP, can_flip: bool = True,
        startup_s: float = 10.0, prefill: int = 4, decode: int = 8) -> Cluster:
    c = Cluster(config, prefill=prefill, decode=decode, can_flip=can_flip,  # type: ignore[arg-type]
                startup_s=startup_s)
    for load in loads:
        c.tick(load)
    return c


def started(c: Cluster) -> int:
    """Workers started cold over the run (cancelled ones included)."""
    return len(c.ready_at)


def test_mix_shift_flips_the_lightest_decode_workers_to_prefill() -> None:
    flipping, cold = run(chat_to_rag()), run(chat_to_rag(), can_flip=False)
    assert cold.flips == []
    assert [(f.source, f.target) for f in flipping.flips] == [("decode", "prefill")] * 2
    for f in flipping.flips:  # the lightest decode worker goes (the cheapest to migrate)
        assert all(STREAMS.get(f.worker, 0) <= STREAMS.get(w, 0)
                   for w in flipping.ids["decode"])
        assert f.t >= SHIFT_AT + FLIP.flip.window_s
        assert f.inputs["flip_s"] == 2.0
    swap, grow = flipping.flips
    assert (swap.move, grow.move) == ("swap", "grow")
    # First a swap: decode shrinks by its own decision while a prefill worker asked for
    # 2 s earlier still has 8 s to start; the decode worker leaving serves prefill in 2 s
    # and the cold one is cancelled (prefill's count unchanged).
    assert swap.inputs["start_left_s"] == 8.0 and swap.inputs["short_in_s"] < 8.0
    at = {d.role: d for d in flipping.decisions if d.t == swap.t}
    assert (at["prefill"].current, at["prefill"].desired, at["prefill"].flips) == (9, 9, 1)
    assert at["prefill"].scales  # the cancel
    assert at["decode"].flips == -1 and at["decode"].victims == ()
    assert "flipping 1 in" in at["prefill"].describe()
    # Then a grow: prefill grows while decode's surplus has lasted the flip window: the
    # flip is the increase (no cold start) and the decrease (no drain).
    assert grow.inputs["start_s"] == FLIP.coupled.lead_s
    assert grow.inputs["short_in_s"] < grow.inputs["start_s"]
    at = {d.role: d for d in flipping.decisions if d.t == grow.t}
    assert (at["prefill"].desired - at["prefill"].current, at["prefill"].flips) == (1, 1)
    assert not at["prefill"].scales
    assert at["decode"].flips == -1 and at["decode"].victims == ()
    # Same pools in the end, fewer cold starts on the way.
    assert flipping.current == cold.current == {"prefill": 8, "decode": 4}
    assert started(flipping) < started(cold)


def test_rag_to_chat_flips_a_prefill_worker_holding_no_leased_kv() -> None:
    leased = {f"p{i}": 4 for i in range(8) if i != 5}  # only p5 has no push in progress
    loads = [steady(50_000, 6_000, leased=leased) for _ in range(int(SHIFT_AT))]
    loads += [steady(50_000 - 25_000 * min(i, 40) / 40, 6_000 + 6_000 * min(i, 40) / 40,
                     leased=leased) for i in range(40)]
    eager = replace(FLIP, flip=replace(FLIP.flip, window_s=0.0))
    c = run(loads, config=eager, prefill=8, decode=4)
    assert [(f.worker, f.source, f.target) for f in c.flips] == [("p5", "prefill", "decode")]
    assert "p5" in c.ids["decode"]


def test_no_flip_without_the_actuator_when_disabled_or_when_a_start_is_as_fast() -> None:
    assert run(chat_to_rag(), can_flip=False).flips == []
    assert run(chat_to_rag(), config=CFG).flips == []  # flip.enabled false
    slow_flip = replace(FLIP, flip=replace(FLIP.flip, flip_s=FLIP.coupled.lead_s))
    assert run(chat_to_rag(), config=slow_flip).flips == []


def test_the_observed_start_up_replaces_the_configured_one() -> None:
    # Workers that serve one tick after they are asked for: a cold start (~1 s) beats a
    # 2 s flip once one has been seen, whatever lead_s says.
    c = run(chat_to_rag(), startup_s=1.0)
    assert c.scaler._flips.clock.seconds <= 2.0  # type: ignore[attr-defined]
    assert c.flips == []


def test_start_clock_measures_decision_to_serving_and_drops_cancelled_asks() -> None:
    clock = StartClock(configured_s=60.0)
    assert clock.seconds == 60.0
    clock.asked(10.0, "decode", 5)
    clock.asked(12.0, "prefill", 3)
    clock.observe(30.0, "decode", current=5, serving=4)
    clock.observe(40.0, "decode", current=5, serving=5)
    clock.observe(41.0, "prefill", current=2, serving=2)  # scaled down before it served
    clock.observe(90.0, "prefill", current=3, serving=3)
    assert clock.seconds == 30.0


def test_a_grow_waits_for_the_donors_surplus_to_last_the_flip_window() -> None:
    patient = replace(FLIP, flip=replace(FLIP.flip, window_s=1_000.0))
    flips = run(chat_to_rag(), config=patient).flips
    # Only swaps: decode workers its own (stabilized) decisions remove.
    assert flips and all(f.move == "swap" and "start_left_s" in f.inputs for f in flips)


def test_no_surplus_counts_before_the_metrics_window_is_full() -> None:
    # An oversized decode pool beside a prefill pool growing from the first second: the
    # first window's rates are not a demand yet; the grow waits for a full window (t = 5:
    # window_s 4 after the first scrape) plus the flip window.
    c = run([steady(3_000 + 2_000 * i, 6_000) for i in range(20)], prefill=1, decode=10)
    assert c.flips and all(f.move == "grow" for f in c.flips)
    assert min(f.t for f in c.flips) >= 1 + CFG.window_s + FLIP.flip.window_s
    ups = [d.t for d in c.decisions if d.role == "prefill" and d.direction == "up"]
    assert min(ups) < 1 + CFG.window_s  # prefill grew cold before then


def test_never_below_the_donors_minimum_nor_its_last_worker() -> None:
    floor = replace(FLIP, decode=Bounds(7, 64))
    c = run(chat_to_rag(), config=floor)
    assert len(c.flips) <= 1 and all(h["decode"] >= 7 for h in c.history)
    # A one-worker decode pool never gives its worker away, however short prefill is.
    lone = run([steady(5_000, 100) for _ in range(12)]
               + [steady(5_000 + 4_000 * i, 100) for i in range(30)], prefill=1, decode=1)
    assert lone.flips == [] and all(h["decode"] == 1 for h in lone.history)


def test_flips_honour_cooldowns_and_do_not_flap() -> None:
    # Chat -> RAG -> chat: every flip's target pool does not give a worker back before its
    # down cooldown, and no worker flips twice within it.
    back = [steady(50_000 - 25_000 * min(i, 40) / 40, 6_000 + 6_000 * min(i, 40) / 40,
                   streams=STREAMS) for i in range(80)]
    c = run(chat_to_rag() + back)
    assert c.flips
    for f in c.flips:
        later = [g for g in c.flips if g.source == f.target and g.t > f.t]
        assert all(g.t - f.t >= FLIP.cooldown.down_s for g in later)
    for role in ("prefill", "decode"):
        counts = [h[role] for h in c.history]
        moves = [b - a for a, b in zip(counts, counts[1:], strict=False) if a != b]
        reversals = sum(1 for a, b in zip(moves, moves[1:], strict=False) if a * b < 0)
        assert reversals <= 3, f"{role} flapped: {counts}"


def test_forecast_short_in() -> None:
    f = Forecast(now=4, ahead=8, horizon_s=40.0)
    assert f.short_in(3, 0.1) == 0.0  # short now
    assert f.short_in(6, 0.1) == pytest.approx(20.0)  # the need crosses 6 halfway
    assert f.short_in(8, 0.1) == math.inf
    assert Forecast(4, 4, 40.0, miss=1.5).short_in(9, 0.1) == 0.0  # a latency miss


def test_flips_are_logged_and_counted() -> None:
    flip = Flip(3.0, "d3", "decode", "prefill", "grow", {"start_s": 60.0, "flip_s": 8.0})
    assert flip.describe() == ("autoscale flip d3: decode -> prefill (grow) | start_s=60 "
                               "flip_s=8")
    exporter = DecisionExporter()
    exporter.record_flip(flip)
    exporter.record(Decision(3.0, "prefill", 4, 5, Proposal(5, "prompt_tokens_per_s"),
                             "follow; flip in", flips=1), 4)
    assert 'tandem_autoscaler_flips_total{source="decode",target="prefill"} 1.0' \
        in exporter.text()


def test_the_kubernetes_actuator_cannot_flip_and_refuses_to_pretend() -> None:
    """Its pods' role is in their Deployment (and the router's discovery reads it from
    their labels): a flip would need the pod moved between Deployments, which it does not
    do. The Ray actuator flips (tests/integration/test_ray_up.py)."""
    from kubernetes import client

    actuator = KubernetesActuator(client.ApiClient(), "ns")
    assert actuator.can_flip is False
    with pytest.raises(FlipUnsupportedError, match="one role's Deployment"):
        asyncio.run(actuator.flip("d3", "prefill"))
    assert RayActuator(pool=None, bundles={}, request_resources=False).can_flip is True


def test_the_ray_actuator_does_not_flip_tensor_parallel_groups() -> None:
    """A pool of tensor-parallel workers (tandem up's spec says so: LaunchSpec.flips) gets
    no flips planned: a group keeps its role."""
    from tandem.launcher.spec import LaunchSpec

    spec = LaunchSpec(insecure=True, decode_ranks=2)
    actuator = RayActuator(pool=None, bundles={}, request_resources=False, flips=spec.flips)
    assert actuator.can_flip is False
