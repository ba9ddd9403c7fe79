"""The pure decision loop: snapshot in, one decision per role (and any role flips) out.

    Snapshot ──> MetricsWindow ──> WindowStats ──> policy ──> Proposal per role
             ──> Stabilizer (+ what may leave now: drains.py) ──> Decision per role
             ──> role flips, where the cluster can flip (flips.py: coupled policy only)
                 (a decrease names the workers to drain; a flip the worker that switches)

No clock, no I/O: time is the snapshot's ``t``, so synthetic traces drive it in tests exactly
as the controller's scrapes do in a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from tandem.autoscaler.config import AutoscaleConfig
from tandem.autoscaler.coupled import CoupledPolicy
from tandem.autoscaler.decision import Decision
from tandem.autoscaler.drains import DrainOptions, drain_options, victims
from tandem.autoscaler.flips import Flip, FlipPlanner
from tandem.autoscaler.metrics import MetricsWindow, Snapshot
from tandem.autoscaler.policies import build_policy
from tandem.autoscaler.roles import ROLES, RoleName
from tandem.autoscaler.stabilizer import Stabilizer


@dataclass(frozen=True, slots=True)
class Plan:
    """One step's decisions (one per role, in ``ROLES`` order) and its role flips."""

    decisions: list[Decision]
    flips: list[Flip]


class Autoscaler:
    """Window + policy + stabilizer (+ flip planner) for one cluster."""

    def __init__(self, config: AutoscaleConfig) -> None:
        self.config = config
        self.window = MetricsWindow(config.window_s)
        self._policy = build_policy(config)
        self._stabilizer = Stabilizer(config)
        self._flips = FlipPlanner(config)

    def step(self, snap: Snapshot, current: Mapping[RoleName, int]) -> list[Decision]:
        """Add a scrape and decide each role's replica count given the ``current`` counts
        (no flips: a cluster that cannot flip)."""
        return self.plan(snap, current).decisions

    def plan(self, snap: Snapshot, current: Mapping[RoleName, int], can_flip: bool = False
             ) -> Plan:
        """Add a scrape and decide; ``can_flip``: the actuator can switch a worker's role
        (flips are planned only then, and only with ``flip.enabled``)."""
        self.window.add(snap)
        stats = self.window.stats()
        proposals = self._policy(stats, current)
        inputs = stats.as_dict()
        clock = self._flips.clock
        for role in ROLES:
            clock.observe(snap.t, role, current[role], len(snap.of(role)))
        decided: dict[RoleName, Decision] = {}
        options: dict[RoleName, DrainOptions] = {}
        for role in ROLES:
            options[role] = drain_options(role, snap, current[role])
            decided[role] = self._stabilizer.decide(snap.t, role, current[role],
                                                    proposals[role], inputs,
                                                    options[role].removable)
        flips: list[Flip] = []
        policy = self._policy
        if self.config.flip.enabled and isinstance(policy, CoupledPolicy):
            self._flips.note(snap.t, proposals, dict(current),
                             measured=stats.span_s >= self.config.window_s)
            if can_flip:
                decided, flips = self._flips.plan(snap.t, snap, decided, proposals,
                                                  policy.forecast, self._stabilizer)
        flipped = {f.worker for f in flips}
        decisions = []
        for role in ROLES:
            d = decided[role]
            if d.desired - d.flips < d.current:
                order = tuple(w for w in options[role].order if w not in flipped)
                left = DrainOptions(options[role].removable, order)
                names = victims(left, snap, role, d.current, d.desired - d.flips)
                load = sum(w.queue_depth for w in snap.of(role) if w.worker_id in names)
                d = replace(d, victims=names, victim_load=load)
            if d.desired > d.current + d.flips:
                clock.asked(snap.t, role, d.desired)
            decisions.append(d)
        return Plan(decisions, flips)
