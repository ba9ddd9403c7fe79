"""Autoscaler configuration: frozen, validated dataclasses built from a YAML file.

    policy: slo            # slo | queue | fixed | coupled
    interval_s: 5          # scrape + decide period
    window_s: 30           # metrics window the policy sees
    tolerance: 0.1         # hysteresis band: |observed/target - 1| <= tolerance holds still
    stabilization_s: 60    # scale down only to the highest proposal of this long ago
    cooldown: {up_s: 10, down_s: 60}
    max_step: {up: 2, down: 1}
    prefill: {min: 1, max: 4}
    decode: {min: 1, max: 4}
    slo: {ttft_p90_s: 0.5, itl_mean_s: 0.05, kv_usage: 0.8,
          prefill_tokens_per_s: 4000, decode_tokens_per_s: 400, utilization: 0.8}
    queue: {prefill_queue_depth: 4, prefill_queue_tokens: 4096, decode_queue_depth: 16}
    fixed: {prefill: 1, decode: 1}
    coupled: {ttft_p90_s: 2.0, tpot_p90_s: 0.1, prefill_utilization: 0.7,
              decode_step_share: 0.8, kv_usage: 0.85, max_rows: 64, lead_s: 60,
              trend_s: 60, max_gain: 4, prefill_token_s: 0, prefill_base_s: 0,
              prefill_chunk_tokens: 2048, decode_base_s: 0, decode_row_s: 0}
    flip: {enabled: false, flip_s: 10, window_s: 15}   # role flips (coupled only)
    request_resources: true  # Ray: ask the cluster autoscaler for nodes ahead of demand
    metrics_port: 0          # >0: serve the decision metrics on this port

Every key is optional except ``policy``; unknown keys, wrong types and out-of-range values
raise ``AutoscaleConfigError`` naming the offending key.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

POLICIES = ("slo", "queue", "fixed", "coupled")


class AutoscaleConfigError(ValueError):
    """The autoscale YAML is unreadable or invalid (the message names the key)."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """How few and how many replicas one role may have."""

    min: int = 1
    max: int = 4

    def __post_init__(self) -> None:
        if self.min < 0 or self.max < 1 or self.min > self.max:
            raise AutoscaleConfigError(f"bounds need 0 <= min <= max, max >= 1: {self}")

    def clamp(self, n: int) -> int:
        """``n`` forced into [min, max]."""
        return max(self.min, min(self.max, n))


@dataclass(frozen=True, slots=True)
class Cooldown:
    """Minimum seconds after any change before the next scale-up / scale-down."""

    up_s: float = 10.0
    down_s: float = 60.0


@dataclass(frozen=True, slots=True)
class MaxStep:
    """Most replicas one decision may add / remove per role."""

    up: int = 2
    down: int = 1


@dataclass(frozen=True, slots=True)
class SloTargets:
    """The ``slo`` policy's targets and the per-replica throughputs that size the P:D mix."""

    ttft_p90_s: float = 0.5
    itl_mean_s: float = 0.05
    kv_usage: float = 0.8
    prefill_tokens_per_s: float = 4000.0  # prompt tokens one prefill replica handles
    decode_tokens_per_s: float = 400.0  # output tokens one decode replica streams
    utilization: float = 0.8  # size the token-mix floor for this busy fraction


@dataclass(frozen=True, slots=True)
class QueueTargets:
    """The ``queue`` policy's per-replica thresholds."""

    prefill_queue_depth: float = 4.0
    prefill_queue_tokens: float = 4096.0
    decode_queue_depth: float = 16.0


@dataclass(frozen=True, slots=True)
class FixedCounts:
    """The ``fixed`` policy's replica counts."""

    prefill: int = 1
    decode: int = 1


@dataclass(frozen=True, slots=True)
class CoupledTargets:
    """The ``coupled`` policy's SLO (as the router measures it), its sizing model's headroom,
    and step-cost priors for workers that have not fitted theirs yet (0: none)."""

    ttft_p90_s: float = 2.0  # router: arrival to first token, p90 over the window
    tpot_p90_s: float = 0.1  # router: per finished request, p90 over the window
    prefill_utilization: float = 0.7  # busy share a prefill worker is sized for
    decode_step_share: float = 0.8  # a decode batch's step may take this share of the TPOT
    kv_usage: float = 0.85  # decode KV usage the pool is sized for
    max_rows: int = 64  # decode rows per step at most (the workers' --max-num-seqs)
    lead_s: float = 60.0  # size for the demand this far ahead (a new worker's start-up)
    trend_s: float = 60.0  # the demand's trend is fitted over this long
    max_gain: float = 4.0  # how far latency feedback may raise the model's sizes
    prefill_token_s: float = 0.0  # priors: seconds per prompt token, per step, ...
    prefill_base_s: float = 0.0
    prefill_chunk_tokens: int = 2048
    decode_base_s: float = 0.0
    decode_row_s: float = 0.0


@dataclass(frozen=True, slots=True)
class FlipSettings:
    """Role flips (tandem/autoscaler/flips.py): a serving worker switches prefill <-> decode
    with its weights loaded instead of one pool draining while the other cold-starts.

    Only the ``coupled`` policy flips, and only when the actuator says it can (today's Ray
    and Kubernetes actuators cannot: the workers have no runtime role switch yet)."""

    enabled: bool = False
    flip_s: float = 10.0  # a flip's time until the worker serves its new role (migrating
    # its streams away or finishing its queued prefills comes before it)
    window_s: float = 15.0  # a donor pool must have proposed fewer workers this long: the
    # flip's own stabilization (undoing a flip costs a flip, not a cold start)


@dataclass(frozen=True, slots=True)
class AutoscaleConfig:
    """The whole autoscaler configuration (see the module docstring for the YAML)."""

    policy: str = "slo"
    interval_s: float = 5.0
    window_s: float = 30.0
    tolerance: float = 0.1
    stabilization_s: float = 60.0
    cooldown: Cooldown = field(default_factory=Cooldown)
    max_step: MaxStep = field(default_factory=MaxStep)
    prefill: Bounds = field(default_factory=Bounds)
    decode: Bounds = field(default_factory=Bounds)
    slo: SloTargets = field(default_factory=SloTargets)
    queue: QueueTargets = field(default_factory=QueueTargets)
    fixed: FixedCounts = field(default_factory=FixedCounts)
    coupled: CoupledTargets = field(default_factory=CoupledTargets)
    flip: FlipSettings = field(default_factory=FlipSettings)
    request_resources: bool = True
    metrics_port: int = 0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise AutoscaleConfigError(f"policy: must be one of {', '.join(POLICIES)}")
        positive = {
            "interval_s": self.interval_s, "window_s": self.window_s,
            "slo.ttft_p90_s": self.slo.ttft_p90_s, "slo.itl_mean_s": self.slo.itl_mean_s,
            "slo.kv_usage": self.slo.kv_usage,
            "slo.prefill_tokens_per_s": self.slo.prefill_tokens_per_s,
            "slo.decode_tokens_per_s": self.slo.decode_tokens_per_s,
            "slo.utilization": self.slo.utilization,
            "queue.prefill_queue_depth": self.queue.prefill_queue_depth,
            "queue.prefill_queue_tokens": self.queue.prefill_queue_tokens,
            "queue.decode_queue_depth": self.queue.decode_queue_depth,
            "max_step.up": self.max_step.up, "max_step.down": self.max_step.down,
            "coupled.ttft_p90_s": self.coupled.ttft_p90_s,
            "coupled.tpot_p90_s": self.coupled.tpot_p90_s,
            "coupled.prefill_utilization": self.coupled.prefill_utilization,
            "coupled.decode_step_share": self.coupled.decode_step_share,
            "coupled.kv_usage": self.coupled.kv_usage, "coupled.max_rows": self.coupled.max_rows,
            "coupled.trend_s": self.coupled.trend_s,
            "coupled.prefill_chunk_tokens": self.coupled.prefill_chunk_tokens,
            "flip.flip_s": self.flip.flip_s,
        }
        non_negative = {
            "tolerance": self.tolerance, "stabilization_s": self.stabilization_s,
            "cooldown.up_s": self.cooldown.up_s, "cooldown.down_s": self.cooldown.down_s,
            "metrics_port": self.metrics_port, "coupled.lead_s": self.coupled.lead_s,
            "coupled.prefill_token_s": self.coupled.prefill_token_s,
            "coupled.prefill_base_s": self.coupled.prefill_base_s,
            "coupled.decode_base_s": self.coupled.decode_base_s,
            "coupled.decode_row_s": self.coupled.decode_row_s,
            "flip.window_s": self.flip.window_s,
        }
        for key, value in positive.items():
            if not value > 0:
                raise AutoscaleConfigError(f"{key}: must be > 0, got {value}")
        for key, value in non_negative.items():
            if value < 0:
                raise AutoscaleConfigError(f"{key}: must be >= 0, got {value}")
        if self.slo.kv_usage > 1 or self.slo.utilization > 1:
            raise AutoscaleConfigError("slo.kv_usage and slo.utilization: must be <= 1")
        c = self.coupled
        if max(c.prefill_utilization, c.decode_step_share, c.kv_usage) > 1:
            raise AutoscaleConfigError("coupled.prefill_utilization, coupled.decode_step_share "
                                       "and coupled.kv_usage: must be <= 1")
        if c.max_gain < 1:
            raise AutoscaleConfigError(f"coupled.max_gain: must be >= 1, got {c.max_gain}")
        if self.flip.enabled and self.policy != "coupled":
            raise AutoscaleConfigError("flip.enabled: only the coupled policy flips roles")
        if self.metrics_port > 65535:
            raise AutoscaleConfigError("metrics_port: must be <= 65535")
        for role in ("prefill", "decode"):
            bounds: Bounds = getattr(self, role)
            count = getattr(self.fixed, role)
            if self.policy == "fixed" and not bounds.min <= count <= bounds.max:
                raise AutoscaleConfigError(f"fixed.{role}: {count} outside {role}.min..max")

    def bounds(self, role: str) -> Bounds:
        """The min/max of ``role``."""
        return self.prefill if role == "prefill" else self.decode


_SECTIONS: dict[str, type] = {
    "cooldown": Cooldown, "max_step": MaxStep, "prefill": Bounds, "decode": Bounds,
    "slo": SloTargets, "queue": QueueTargets, "fixed": FixedCounts, "coupled": CoupledTargets,
    "flip": FlipSettings,
}


def parse_config(data: Any) -> AutoscaleConfig:
    """An ``AutoscaleConfig`` from the parsed YAML mapping."""
    if not isinstance(data, dict):
        raise AutoscaleConfigError("the autoscale file must be a mapping of keys to values")
    if "policy" not in data:
        raise AutoscaleConfigError(f"policy: missing ({', '.join(POLICIES)})")
    kwargs: dict[str, Any] = {}
    for f in fields(AutoscaleConfig):
        if f.name not in data:
            continue
        value = data[f.name]
        if f.name in _SECTIONS:
            kwargs[f.name] = _section(f.name, _SECTIONS[f.name], value)
        else:
            kwargs[f.name] = _scalar(f.name, value, _default_of(AutoscaleConfig, f.name))
    unknown = sorted(set(data) - {f.name for f in fields(AutoscaleConfig)})
    if unknown:
        raise AutoscaleConfigError(f"unknown key(s): {', '.join(map(str, unknown))}")
    try:
        return AutoscaleConfig(**kwargs)
    except AutoscaleConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise AutoscaleConfigError(str(exc)) from exc


def load_config(path: str | Path) -> AutoscaleConfig:
    """Read and validate an autoscale YAML file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise AutoscaleConfigError(f"cannot read {path}: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise AutoscaleConfigError(f"{path}: not valid YAML: {exc}") from exc
    return parse_config(data)


def _section(name: str, cls: type, value: Any) -> Any:
    if not isinstance(value, dict):
        raise AutoscaleConfigError(f"{name}: must be a mapping")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise AutoscaleConfigError(f"{name}: unknown key(s): {', '.join(map(str, unknown))}")
    kwargs = {k: _scalar(f"{name}.{k}", v, _default_of(cls, k)) for k, v in value.items()}
    return cls(**kwargs)


def _default_of(cls: type, name: str) -> Any:
    return getattr(cls(), name)


def _scalar(key: str, value: Any, default: Any) -> Any:
    """``value`` checked against the type of the field's default."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise AutoscaleConfigError(f"{key}: must be true or false")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise AutoscaleConfigError(f"{key}: must be an integer")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise AutoscaleConfigError(f"{key}: must be a number")
        return float(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise AutoscaleConfigError(f"{key}: must be a string")
        return value
    raise AutoscaleConfigError(f"{key}: unsupported value")  # pragma: no cover
