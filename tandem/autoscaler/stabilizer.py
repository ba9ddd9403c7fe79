"""From a policy's proposal to a decision: min/max, cooldowns, step limits, hysteresis.

    proposal ──clamp [min, max]──> down? only to the highest proposal of the last
    stabilization_s (a dip must last that long) ──> cooldown since the last change
    (up_s / down_s) ──> at most max_step.up / .down per decision ──> at most the workers
    that may leave now (tandem/autoscaler/drains.py: never a prefill worker holding leased KV)
    ──> Decision

The down-scale window is what keeps oscillating load from flapping: a pool grown for the peaks
stays grown while peaks keep coming, and shrinks only once a whole window has been quiet.
Scale-up stays fast (short cooldown) because an SLO miss costs more than an idle replica.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from tandem.autoscaler.config import AutoscaleConfig
from tandem.autoscaler.decision import Decision, Proposal
from tandem.autoscaler.roles import RoleName


@dataclass(slots=True)
class _RoleState:
    last_change_t: float = -math.inf
    history: deque[tuple[float, int]] = field(default_factory=deque)


class Stabilizer:
    """Keeps each role's history and turns proposals into decisions."""

    def __init__(self, config: AutoscaleConfig) -> None:
        self.config = config
        self._state: dict[str, _RoleState] = {"prefill": _RoleState(), "decode": _RoleState()}

    def since_change(self, role: RoleName, t: float) -> float:
        """Seconds since ``role``'s last change (inf: none yet)."""
        return t - self._state[role].last_change_t

    def note_change(self, role: RoleName, t: float) -> None:
        """``role`` changed at ``t`` outside ``decide`` (a role flip): its cooldowns run
        from now."""
        self._state[role].last_change_t = t

    def decide(
        self,
        t: float,
        role: RoleName,
        current: int,
        proposal: Proposal,
        inputs: dict[str, float | None] | None = None,
        removable: int | None = None,
    ) -> Decision:
        """The replica count ``role`` should have now, and why. ``removable``: how many
        workers a decrease may remove now (None: any)."""
        cfg, state = self.config, self._state[role]
        bounds = cfg.bounds(role)
        desired = bounds.clamp(proposal.replicas)
        reason = "follow"
        if desired != proposal.replicas:
            reason = "clamp: min" if proposal.replicas < bounds.min else "clamp: max"
        if not state.history and cfg.stabilization_s > 0:
            # The first decision: the count it finds is the window's standing proposal, so a
            # dip must last stabilization_s from here too (not shrink on an empty window).
            state.history.append((t, current))
        state.history.append((t, desired))
        while state.history and t - state.history[0][0] > cfg.stabilization_s:
            state.history.popleft()
        if desired < current:
            recent_high = max(v for _, v in state.history)
            floor = min(recent_high, current)
            if floor > desired:
                desired, reason = floor, "hold: stabilization"
        since = t - state.last_change_t
        if desired > current:
            if since < cfg.cooldown.up_s:
                desired, reason = current, "hold: cooldown"
            elif desired > current + cfg.max_step.up:
                desired, reason = current + cfg.max_step.up, "step: max up"
        elif desired < current:
            if since < cfg.cooldown.down_s:
                desired, reason = current, "hold: cooldown"
            elif desired < current - cfg.max_step.down:
                desired, reason = current - cfg.max_step.down, "step: max down"
            if removable is not None and desired < current - removable:
                desired = current - removable
                reason = "hold: leased KV" if removable == 0 else "step: leased KV"
        if not bounds.min <= desired <= bounds.max:  # current itself out of bounds: fix now
            desired, reason = bounds.clamp(desired), "bounds"
        if desired != current:
            state.last_change_t = t
        return Decision(t, role, current, desired, proposal, reason, dict(inputs or {}))
