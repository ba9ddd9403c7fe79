"""The pure decision loop: snapshot in, one decision per role out.

    Snapshot ──> MetricsWindow ──> WindowStats ──> policy ──> Proposal per role
             ──> Stabilizer (+ what may leave now: drains.py) ──> Decision per role
                 (a decrease names the workers to drain)

No clock, no I/O: time is the snapshot's ``t``, so synthetic traces drive it in tests exactly
as the controller's scrapes do in a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from tandem.autoscaler.config import AutoscaleConfig
from tandem.autoscaler.decision import Decision
from tandem.autoscaler.drains import drain_options, victims
from tandem.autoscaler.metrics import MetricsWindow, Snapshot
from tandem.autoscaler.policies import build_policy
from tandem.autoscaler.roles import ROLES, RoleName
from tandem.autoscaler.stabilizer import Stabilizer


class Autoscaler:
    """Window + policy + stabilizer for one cluster."""

    def __init__(self, config: AutoscaleConfig) -> None:
        self.config = config
        self.window = MetricsWindow(config.window_s)
        self._policy = build_policy(config)
        self._stabilizer = Stabilizer(config)

    def step(self, snap: Snapshot, current: Mapping[RoleName, int]) -> list[Decision]:
        """Add a scrape and decide each role's replica count given the ``current`` counts."""
        self.window.add(snap)
        stats = self.window.stats()
        proposals = self._policy(stats, current)
        inputs = stats.as_dict()
        decisions = []
        for role in ROLES:
            options = drain_options(role, snap, current[role])
            d = self._stabilizer.decide(snap.t, role, current[role], proposals[role], inputs,
                                        options.removable)
            if d.desired < d.current:
                names = victims(options, snap, role, d.current, d.desired)
                load = sum(w.queue_depth for w in snap.of(role) if w.worker_id in names)
                d = replace(d, victims=names, victim_load=load)
            decisions.append(d)
        return decisions
