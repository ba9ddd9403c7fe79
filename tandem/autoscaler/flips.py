"""Role flips: a serving worker switches prefill <-> decode with its weights loaded, chosen
beside scale-up and scale-down when the token mix shifts faster than a new worker starts.

    the stabilizer's decisions ──> taker pool T growing (cooldown.up, max, max_step.up passed)
                                   donor pool D with a lasting surplus
    flip n workers D -> T when every one of these holds:
      speed      a flip serves sooner than a cold start:        flip_s < start_s
      urgency    T's shortfall comes before a cold start would:  short_in(T) < start_s
                 (0 when T is short now or misses its latency target; else when its
                 forecast need crosses its count, the policy's demand trend interpolated)
      surplus    D proposed fewer than it has at every decision of the last flip.window_s
                 (the flip's own stabilization: undoing a flip costs a flip, not a start),
                 and its forecast need ahead leaves the workers spare too
      safety     D keeps max(min, 1) workers and one serving worker (never its last);
                 D's down cooldown has run; a prefill worker holding leased KV is not
                 flipped (drains.py's order: the cheapest to move first)
    n = min(T's increase, D's spare workers, max_step.down, D's movable serving workers)

``start_s`` is the start-up the autoscaler observed (the median of its last scale-ups:
decision to the pool serving at that count), else the configured ``coupled.lead_s``. A flip
takes n of T's increase (the rest still starts cold) and n of D's decrease (D drains only
what its own decision removes beyond them); both pools' cooldowns run from it. Each flip
is a :class:`Flip` with its inputs, as each decision keeps its own.

Pure: decisions, proposals and a snapshot in; flips out. Whether the cluster can flip at
all is the actuator's to say (``Actuator.can_flip``); the autoscaler plans none otherwise.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field, replace

from tandem.autoscaler.config import AutoscaleConfig
from tandem.autoscaler.decision import Decision, Proposal
from tandem.autoscaler.drains import drain_options
from tandem.autoscaler.metrics import Snapshot
from tandem.autoscaler.roles import ROLES, RoleName
from tandem.autoscaler.stabilizer import Stabilizer

START_SAMPLES = 8  # scale-ups whose observed start-up the estimate keeps


class FlipUnsupportedError(RuntimeError):
    """An actuator was asked to flip a worker's role but its cluster cannot (its
    ``can_flip`` is false: the autoscaler never asks then)."""


@dataclass(frozen=True, slots=True)
class Forecast:
    """What one pool needs now and ``horizon_s`` from now (the policy's demand and its
    trend), and its latency against its target (observed / target; None: not measured)."""

    now: int
    ahead: int
    horizon_s: float
    miss: float | None = None

    def short_in(self, have: int, tolerance: float) -> float:
        """Seconds until ``have`` workers are too few: 0 now (need or latency miss), inf
        if not by the horizon, else where the need, linear from now to the horizon,
        crosses ``have``."""
        if self.now > have or (self.miss or 0.0) > 1.0 + tolerance:
            return 0.0
        if self.ahead <= have:
            return math.inf
        return self.horizon_s * (have - self.now) / (self.ahead - self.now)


@dataclass(frozen=True, slots=True)
class Flip:
    """One worker told to switch roles at ``t``, and why."""

    t: float
    worker: str  # the worker id
    source: RoleName
    target: RoleName
    inputs: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        """One log line: the flip and every input."""
        inputs = " ".join(f"{k}={v:.4g}" for k, v in self.inputs.items())
        return f"autoscale flip {self.worker}: {self.source} -> {self.target} | {inputs}"


class StartClock:
    """The start-up the cluster shows: from a scale-up's decision to its pool serving at
    the count it asked for (cancelled asks are dropped)."""

    def __init__(self, configured_s: float) -> None:
        self.configured_s = configured_s
        self._asked: dict[RoleName, list[tuple[float, int]]] = {r: [] for r in ROLES}
        self._seen: deque[float] = deque(maxlen=START_SAMPLES)

    def asked(self, t: float, role: RoleName, count: int) -> None:
        """A decision at ``t`` started workers for ``role`` to reach ``count``."""
        self._asked[role].append((t, count))

    def observe(self, t: float, role: RoleName, current: int, serving: int) -> None:
        """``role`` has ``current`` workers counted (starting too), ``serving`` serving."""
        pending = []
        for asked_t, count in self._asked[role]:
            if serving >= count:
                self._seen.append(t - asked_t)
            elif current >= count:  # still starting (not cancelled by a scale-down)
                pending.append((asked_t, count))
        self._asked[role] = pending

    @property
    def seconds(self) -> float:
        """The median observed start-up, else the configured one."""
        return statistics.median(self._seen) if self._seen else self.configured_s


class FlipPlanner:
    """Chooses flips after the stabilizer has decided (see the module docstring); keeps the
    proposals of the flip window and the start-up clock."""

    def __init__(self, config: AutoscaleConfig) -> None:
        self.config = config
        self.clock = StartClock(config.coupled.lead_s)
        self._below: dict[RoleName, deque[tuple[float, bool]]] = {r: deque() for r in ROLES}

    def note(self, t: float, proposals: dict[RoleName, Proposal],
             current: dict[RoleName, int]) -> None:
        """Record whether each pool proposed fewer workers than it has at ``t``."""
        for role in ROLES:
            below = self._below[role]
            below.append((t, proposals[role].replicas < current[role]))
            while len(below) > 1 and t - below[1][0] >= self.config.flip.window_s:
                below.popleft()  # keep one point at or before the window's start

    def _lasting(self, role: RoleName, t: float) -> bool:
        below = self._below[role]
        return (bool(below) and t - below[0][0] >= self.config.flip.window_s
                and all(b for _, b in below))

    def plan(self, t: float, snap: Snapshot, decisions: dict[RoleName, Decision],
             proposals: dict[RoleName, Proposal], forecast: dict[RoleName, Forecast],
             stabilizer: Stabilizer) -> tuple[dict[RoleName, Decision], list[Flip]]:
        """The decisions with their flips, and the flips (none when no pool qualifies)."""
        cfg = self.config
        for taker in ROLES:
            donor: RoleName = "decode" if taker == "prefill" else "prefill"
            dt, dd = decisions[taker], decisions[donor]
            up = dt.desired - dt.current
            if up <= 0 or taker not in forecast or donor not in forecast:
                continue
            start_s, flip_s = self.clock.seconds, cfg.flip.flip_s
            short_in = forecast[taker].short_in(dt.current, cfg.tolerance)
            if not (flip_s < start_s and short_in < start_s) or not self._lasting(donor, t):
                continue
            if dd.desired == dd.current and stabilizer.since_change(donor, t) \
                    < cfg.cooldown.down_s:
                continue
            if dd.desired > dd.current:
                continue
            fd = forecast[donor]
            keep = max(proposals[donor].replicas, fd.now, fd.ahead, cfg.bounds(donor).min, 1)
            options = drain_options(donor, snap, dd.current)
            serving = len(snap.of(donor))
            movable = [w for w in options.order][:max(0, serving - 1)]
            n = min(up, dd.current - keep, cfg.max_step.down, len(movable))
            if n <= 0:
                continue
            inputs = {"start_s": start_s, "flip_s": flip_s, "short_in_s": short_in,
                      "taker_up": float(up), "donor_spare": float(dd.current - keep)}
            flips = [Flip(t, w, donor, taker, dict(inputs)) for w in movable[:n]]
            removed = max(dd.current - dd.desired, n)
            decisions[taker] = replace(dt, flips=n, reason=f"{dt.reason}; flip in")
            decisions[donor] = replace(dd, desired=dd.current - removed, flips=-n,
                                       reason="flip out" if removed == n
                                       else f"{dd.reason}; flip out")
            stabilizer.note_change(donor, t)
            return decisions, flips
        return decisions, []
