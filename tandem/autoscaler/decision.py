"""Proposals (what a policy wants) and decisions (what the autoscaler will do), with their why.

A policy returns one ``Proposal`` per role: the replica count it wants and the signal that
drove it (e.g. ``ttft_p90_s`` at 0.9 s against a 0.5 s target). The stabilizer turns it into a
``Decision``: clamped, rate-limited, held by cooldowns; the decision keeps the proposal, the
window's figures and the reason it differs, so every log line and metric can say why.
A decision's change may come partly from role flips (tandem/autoscaler/flips.py):
``flips`` workers join (> 0) or leave (< 0) the role by switching roles, the rest of the
change by starting or draining workers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.autoscaler.roles import RoleName


@dataclass(frozen=True, slots=True)
class Proposal:
    """A policy's wish for one role and the signal behind it."""

    replicas: int
    signal: str  # e.g. "ttft_p90_s", "kv_usage", "prompt_tokens_per_s", "fixed", "idle"
    value: float = 0.0  # the signal's observed value
    target: float = 0.0  # what the policy aims for (0: not a target-style signal)


@dataclass(frozen=True, slots=True)
class Decision:
    """What the autoscaler decided for one role at time ``t``."""

    t: float
    role: RoleName
    current: int
    desired: int
    proposal: Proposal
    reason: str  # "follow", "hold: cooldown", "hold: stabilization", "clamp: max", ...
    inputs: dict[str, float | None] = field(default_factory=dict)
    victims: tuple[str, ...] = ()  # a decrease: the serving workers to drain (worker ids)
    victim_load: int = 0  # requests the victims held (what their drains finish or migrate)
    flips: int = 0  # of desired - current: workers flipped in (> 0) or out (< 0)

    @property
    def changed(self) -> bool:
        """Whether acting on this decision changes the replica count."""
        return self.desired != self.current

    @property
    def scales(self) -> bool:
        """Whether the actuator must start or drain workers (beyond the flips)."""
        return self.desired != self.current + self.flips

    @property
    def direction(self) -> str:
        """"up", "down" or "hold"."""
        if self.desired > self.current:
            return "up"
        return "down" if self.desired < self.current else "hold"

    def describe(self) -> str:
        """One log line: the change, the signal that drove it and every input."""
        p = self.proposal
        inputs = " ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.inputs.items()
        )
        drains = (f" draining {', '.join(self.victims)} ({self.victim_load} requests)"
                  if self.victims else "")
        if self.flips:
            drains += f" flipping {abs(self.flips)} {'in' if self.flips > 0 else 'out'}"
        return (
            f"autoscale {self.role}: {self.current} -> {self.desired} ({self.direction}; "
            f"{self.reason}) signal {p.signal}={p.value:.4g} target={p.target:.4g} "
            f"proposed={p.replicas}{drains} | {inputs}"
        )
