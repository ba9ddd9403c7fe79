"""Scaling policies on synthetic metric traces: bursts grow the right pool, steady load holds,
oscillating load does not flap, min/max hold, and decisions say why."""

from __future__ import annotations

from dataclasses import replace

from tandem.autoscaler.autoscaler import Autoscaler
from tandem.autoscaler.config import (
    AutoscaleConfig,
    Bounds,
    Cooldown,
    MaxStep,
    QueueTargets,
    SloTargets,
)
from tandem.autoscaler.decision import Decision
from tandem.autoscaler.metrics import Snapshot, WorkerSample

SLO = AutoscaleConfig(
    policy="slo", interval_s=1, window_s=3, tolerance=0.1, stabilization_s=10,
    cooldown=Cooldown(up_s=2, down_s=5), max_step=MaxStep(up=2, down=1),
    prefill=Bounds(1, 4), decode=Bounds(1, 4),
    slo=SloTargets(ttft_p90_s=0.5, itl_mean_s=0.05, kv_usage=0.8, prefill_tokens_per_s=1000,
                   decode_tokens_per_s=100, utilization=0.8),
)


class Trace:
    """A cluster whose replica counts follow the autoscaler's decisions, fed synthetic load."""

    def __init__(self, config: AutoscaleConfig) -> None:
        self.scaler = Autoscaler(config)
        self.current = {"prefill": 1, "decode": 1}
        self.t = 0.0
        self.totals: dict[str, list[int]] = {}  # worker id -> [prompt total, output total]
        self.history: list[dict[str, int]] = []
        self.decisions: list[Decision] = []

    def tick(self, *, ttft: float | None = None, itl: float | None = None, kv: float = 0.0,
             prompt_tps: float = 0.0, output_tps: float = 0.0, p_queue: int = 0,
             p_tokens: int = 0, d_queue: int = 0) -> dict[str, int]:
        """One second of load spread over the current workers; returns the new counts."""
        self.t += 1.0
        workers = []
        for role in ("prefill", "decode"):
            n = self.current[role]
            for i in range(n):
                wid = f"{role}-{i}"
                tot = self.totals.setdefault(wid, [0, 0])
                if role == "prefill":
                    tot[0] += int(prompt_tps / n)
                    workers.append(WorkerSample(
                        "prefill", wid, num_running=p_queue // n, ttft_p90_s=ttft,
                        queued_prompt_tokens=p_tokens // n, prompt_tokens_total=tot[0]))
                else:
                    tot[1] += int(output_tps / n)
                    workers.append(WorkerSample(
                        "decode", wid, num_running=d_queue // n, kv_cache_usage=kv,
                        itl_mean_s=itl, output_tokens_total=tot[1]))
        decisions = self.scaler.step(Snapshot(self.t, tuple(workers)), dict(self.current))
        for d in decisions:
            self.current[d.role] = d.desired
        self.decisions += decisions
        self.history.append(dict(self.current))
        return dict(self.current)


def _changes(history: list[dict[str, int]], role: str) -> int:
    return sum(1 for a, b in zip(history, history[1:], strict=False) if a[role] != b[role])


def test_prompt_heavy_burst_grows_prefill_not_decode() -> None:
    tr = Trace(SLO)
    for _ in range(10):
        tr.tick(ttft=1.6, itl=0.03, kv=0.2, prompt_tps=3000, output_tps=20)
    assert tr.current["prefill"] >= 3
    assert tr.current["decode"] == 1
    ups = [d for d in tr.decisions if d.role == "prefill" and d.direction == "up"]
    assert ups and {d.proposal.signal for d in ups} <= {"ttft_p90_s", "prompt_tokens_per_s"}
    assert "ttft_p90_s" in ups[0].inputs and ups[0].inputs["ttft_p90_s"] == 1.6


def test_long_output_burst_grows_decode_not_prefill() -> None:
    tr = Trace(SLO)
    for _ in range(10):
        tr.tick(ttft=0.3, itl=0.15, kv=0.5, prompt_tps=200, output_tps=250)
    assert tr.current["decode"] >= 3
    assert tr.current["prefill"] == 1
    ups = [d for d in tr.decisions if d.role == "decode" and d.direction == "up"]
    assert ups[0].proposal.signal in ("itl_mean_s", "output_tokens_per_s")


def test_token_mix_sets_the_pd_ratio_when_latency_is_on_target() -> None:
    """Latency right on target: the pools follow the prompt/output token mix alone."""
    tr = Trace(SLO)
    for _ in range(12):  # 2400 prompt tok/s = 3 prefill replicas at 80%; 160 out tok/s = 2 decode
        tr.tick(ttft=0.5, itl=0.05, kv=0.3, prompt_tps=2400, output_tps=160)
    assert tr.current == {"prefill": 3, "decode": 2}


def test_kv_pressure_grows_decode() -> None:
    tr = Trace(SLO)
    for _ in range(6):
        tr.tick(ttft=0.4, itl=0.05, kv=0.99, prompt_tps=100, output_tps=50)
    assert tr.current["decode"] >= 2
    assert any(d.proposal.signal == "kv_usage" for d in tr.decisions if d.changed)


def test_steady_load_holds_still() -> None:
    tr = Trace(SLO)
    tr.current = {"prefill": 2, "decode": 2}
    for i in range(60):
        wobble = 0.02 if i % 2 else -0.02  # inside the 10% tolerance band
        tr.tick(ttft=0.5 + wobble, itl=0.05 + wobble / 10, kv=0.5, prompt_tps=1200,
                output_tps=120)
    assert all(h == {"prefill": 2, "decode": 2} for h in tr.history)


def test_oscillating_load_does_not_flap() -> None:
    tr = Trace(SLO)
    for i in range(40):  # peaks every other second for 40 s
        if i % 2 == 0:
            tr.tick(ttft=1.2, itl=0.15, kv=0.6, prompt_tps=1500, output_tps=150)
        else:
            tr.tick(ttft=0.05, itl=0.005, kv=0.1, prompt_tps=10, output_tps=1)
    for role in ("prefill", "decode"):
        counts = [h[role] for h in tr.history]
        assert counts == sorted(counts), f"{role} went down while peaks continued: {counts}"
        assert _changes(tr.history, role) <= 2
        assert counts[-1] > 1
    # A whole stabilization window of quiet, then the pools shrink, one step per cooldown.
    for _ in range(40):
        tr.tick()
    assert tr.current == {"prefill": 1, "decode": 1}
    downs = [d for d in tr.decisions if d.direction == "down"]
    assert all(d.proposal.signal == "idle" for d in downs)
    gaps = [b.t - a.t for a, b in zip(downs, downs[1:], strict=False) if a.role == b.role]
    assert all(g >= SLO.cooldown.down_s for g in gaps)


def test_min_and_max_respected() -> None:
    cfg = replace(SLO, prefill=Bounds(2, 3), decode=Bounds(1, 2), cooldown=Cooldown(0, 0))
    tr = Trace(cfg)
    tr.current = {"prefill": 2, "decode": 1}
    for _ in range(15):
        tr.tick(ttft=50.0, itl=5.0, kv=1.0, prompt_tps=10**6, output_tps=10**5)
    assert tr.current == {"prefill": 3, "decode": 2}
    assert any(d.reason == "clamp: max" for d in tr.decisions)
    for _ in range(40):
        tr.tick()
    assert tr.current == {"prefill": 2, "decode": 1}
    assert all(2 <= h["prefill"] <= 3 and 1 <= h["decode"] <= 2 for h in tr.history)


def test_below_min_is_fixed_at_once_even_in_cooldown() -> None:
    tr = Trace(replace(SLO, prefill=Bounds(2, 4)))
    tr.current = {"prefill": 0, "decode": 1}
    tr.tick()
    assert tr.current["prefill"] == 2


def test_queue_policy_tokens_and_depth() -> None:
    cfg = replace(SLO, policy="queue", queue=QueueTargets(prefill_queue_depth=4,
                                                           prefill_queue_tokens=1000,
                                                           decode_queue_depth=8))
    tr = Trace(cfg)
    for _ in range(6):  # few requests but long prompts: the token threshold binds
        tr.tick(p_queue=2, p_tokens=3000, d_queue=4)
    assert tr.current["prefill"] == 3 and tr.current["decode"] == 1
    assert any(d.proposal.signal == "prefill_queue_tokens" for d in tr.decisions if d.changed)
    tr2 = Trace(cfg)
    for _ in range(6):
        tr2.tick(p_queue=1, p_tokens=10, d_queue=30)
    assert tr2.current["decode"] == 4 and tr2.current["prefill"] == 1


def test_fixed_policy_ignores_load() -> None:
    cfg = replace(SLO, policy="fixed", cooldown=Cooldown(0, 0))
    cfg = replace(cfg, fixed=replace(cfg.fixed, prefill=2, decode=3))
    tr = Trace(cfg)
    for i in range(10):
        tr.tick(ttft=5.0 if i % 2 else None, itl=1.0, kv=1.0, prompt_tps=10**5)
    assert tr.current == {"prefill": 2, "decode": 3}
    assert all(d.proposal.signal == "fixed" for d in tr.decisions)


def test_decision_log_line_names_signal_and_inputs() -> None:
    tr = Trace(SLO)
    tr.tick(ttft=2.0, itl=0.01, prompt_tps=100)
    up = next(d for d in tr.decisions if d.role == "prefill")
    line = up.describe()
    assert "prefill: 1 -> 3" in line and "ttft_p90_s=2" in line and "kv_usage=" in line


def test_exported_metrics_follow_the_driving_signal() -> None:
    from tandem.autoscaler.exporter import DecisionExporter

    tr = Trace(SLO)
    exporter = DecisionExporter()
    tr.tick(ttft=2.0, itl=0.01, prompt_tps=100)
    for d in tr.decisions:
        exporter.record(d, 1)
    text = exporter.text()
    assert 'tandem_autoscaler_desired_replicas{role="prefill"} 3.0' in text
    assert 'tandem_autoscaler_signal_value{role="prefill",signal="ttft_p90_s"} 2.0' in text
    assert 'tandem_autoscaler_decisions_total{direction="up",role="prefill",' \
           'signal="ttft_p90_s"} 1.0' in text
    tr.decisions.clear()
    for _ in range(5):  # idle past the window: the prefill signal becomes "idle"
        tr.tick()
    for d in tr.decisions:
        exporter.record(d, 3)
    text = exporter.text()
    assert 'signal_value{role="prefill",signal="ttft_p90_s"}' not in text
    assert 'tandem_autoscaler_signal_value{role="prefill",signal="idle"} 0.0' in text


def test_first_decision_does_not_shrink_before_a_whole_window() -> None:
    """A controller that starts on an idle cluster (nothing measured yet) keeps its pools for
    stabilization_s, as any dip must last that long (before the fix it shrank at once)."""
    for policy in ("slo", "queue", "coupled"):
        tr = Trace(replace(SLO, policy=policy))
        tr.current = {"prefill": 3, "decode": 3}
        for _ in range(int(SLO.stabilization_s)):
            tr.tick()
        assert all(h == {"prefill": 3, "decode": 3} for h in tr.history), policy
        for _ in range(30):
            tr.tick()
        assert tr.current == {"prefill": 1, "decode": 1}, policy
