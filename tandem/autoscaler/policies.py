"""Scaling policies: pure functions from window figures to a proposal per role.

    slo    prefill <- TTFT p90 vs target; decode <- max(ITL vs target, KV usage vs target);
           both floored by the token mix: prompt tokens/s over one prefill replica's
           throughput, output tokens/s over one decode replica's, so P:D follows the workload
    queue  prefill <- max(queue depth, queued prompt tokens) per replica over thresholds;
           decode <- queue depth per replica over its threshold
    fixed  the configured counts
    coupled  both pools from one model: the router's prompt/output token rates (with their
           trend, ahead by a worker's start-up) over what one worker carries inside the SLO
           (its fitted step costs), corrected by the router-side TTFT/TPOT p90 against the
           targets (tandem/autoscaler/coupled.py)

Target-style signals scale proportionally (``ceil(current * observed / target)``, as
Kubernetes' HPA does) outside a tolerance band around the target and hold inside it; that band
is the first layer of hysteresis (the stabilizer adds cooldowns and a down-scale window).
Policies never clamp to min/max: the stabilizer does, and records that it did.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from tandem.autoscaler.config import AutoscaleConfig
from tandem.autoscaler.coupled import CoupledPolicy
from tandem.autoscaler.decision import Proposal
from tandem.autoscaler.metrics import WindowStats
from tandem.autoscaler.roles import RoleName

Policy = Callable[[WindowStats, Mapping[RoleName, int]], dict[RoleName, Proposal]]


def build_policy(config: AutoscaleConfig) -> Policy:
    """The policy named by ``config.policy``, bound to its targets."""
    if config.policy == "slo":
        return lambda stats, current: slo_policy(config, stats, current)
    if config.policy == "queue":
        return lambda stats, current: queue_policy(config, stats, current)
    if config.policy == "coupled":
        return CoupledPolicy(config)
    return lambda stats, current: fixed_policy(config, stats, current)


def proportional(current: int, value: float, target: float, tolerance: float) -> int:
    """HPA's rule: ``ceil(current * value / target)``, or ``current`` within the tolerance."""
    ratio = value / target
    if abs(ratio - 1.0) <= tolerance:
        return current
    return max(0, math.ceil(max(current, 1) * ratio - 1e-9))


def fixed_policy(
    config: AutoscaleConfig, stats: WindowStats, current: Mapping[RoleName, int]
) -> dict[RoleName, Proposal]:
    """The configured counts, whatever the load."""
    return {
        "prefill": Proposal(config.fixed.prefill, "fixed", config.fixed.prefill),
        "decode": Proposal(config.fixed.decode, "fixed", config.fixed.decode),
    }


def queue_policy(
    config: AutoscaleConfig, stats: WindowStats, current: Mapping[RoleName, int]
) -> dict[RoleName, Proposal]:
    """Queue depth and queued prompt tokens against per-replica thresholds."""
    q, tol = config.queue, config.tolerance
    p_now, d_now = current["prefill"], current["decode"]
    by_depth = Proposal(
        _per_replica(p_now, stats.prefill_queue_depth, q.prefill_queue_depth, tol),
        "prefill_queue_depth", stats.prefill_queue_depth, q.prefill_queue_depth * max(p_now, 1),
    )
    by_tokens = Proposal(
        _per_replica(p_now, stats.prefill_queue_tokens, q.prefill_queue_tokens, tol),
        "prefill_queue_tokens", stats.prefill_queue_tokens, q.prefill_queue_tokens * max(p_now, 1),
    )
    decode = Proposal(
        _per_replica(d_now, stats.decode_queue_depth, q.decode_queue_depth, tol),
        "decode_queue_depth", stats.decode_queue_depth, q.decode_queue_depth * max(d_now, 1),
    )
    return {"prefill": _largest(by_depth, by_tokens), "decode": decode}


def slo_policy(
    config: AutoscaleConfig, stats: WindowStats, current: Mapping[RoleName, int]
) -> dict[RoleName, Proposal]:
    """Latency targets per role, floored by the replicas the token mix needs."""
    s, tol = config.slo, config.tolerance
    p_now, d_now = current["prefill"], current["decode"]
    # The token mix: how many replicas' worth of work each role has, at the target busy share.
    p_mix = Proposal(
        math.ceil(stats.prompt_tokens_per_s / (s.prefill_tokens_per_s * s.utilization) - 1e-9),
        "prompt_tokens_per_s", stats.prompt_tokens_per_s, s.prefill_tokens_per_s,
    )
    d_mix = Proposal(
        math.ceil(stats.output_tokens_per_s / (s.decode_tokens_per_s * s.utilization) - 1e-9),
        "output_tokens_per_s", stats.output_tokens_per_s, s.decode_tokens_per_s,
    )
    if stats.ttft_p90_s is None:  # no prefill traffic in the window
        p_lat = Proposal(0, "idle", 0.0, s.ttft_p90_s)
    else:
        p_lat = Proposal(
            proportional(p_now, stats.ttft_p90_s, s.ttft_p90_s, tol),
            "ttft_p90_s", stats.ttft_p90_s, s.ttft_p90_s,
        )
    d_kv = Proposal(
        proportional(d_now, stats.kv_usage, s.kv_usage, tol) if stats.kv_usage > 0 else 0,
        "kv_usage", stats.kv_usage, s.kv_usage,
    )
    if stats.itl_mean_s is None:
        d_lat = Proposal(0, "idle", 0.0, s.itl_mean_s)
    else:
        d_lat = Proposal(
            proportional(d_now, stats.itl_mean_s, s.itl_mean_s, tol),
            "itl_mean_s", stats.itl_mean_s, s.itl_mean_s,
        )
    return {"prefill": _largest(p_lat, p_mix), "decode": _largest(d_lat, d_kv, d_mix)}


def _per_replica(current: int, total: float, per_replica: float, tolerance: float) -> int:
    """Replicas so each carries about ``per_replica``; ``current`` within the tolerance."""
    if total <= 0:
        return 0
    return proportional(current, total / max(current, 1), per_replica, tolerance)


def _largest(*proposals: Proposal) -> Proposal:
    """The proposal asking for the most replicas (the first on ties): the binding signal."""
    best = proposals[0]
    for p in proposals[1:]:
        if p.replicas > best.replicas:
            best = p
    return best
