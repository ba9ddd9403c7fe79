"""Role flips: a serving worker switches prefill <-> decode with its weights loaded, chosen
beside scale-up and scale-down when the token mix shifts faster than a new worker starts.

    the stabilizer's decisions, then for a taker pool T and a donor pool D:
    grow   T grows (its decision passed cooldown.up, max, max_step.up) while D has a
           lasting surplus: flip instead of starting cold
    swap   D shrinks (its decision passed cooldown.down, the down-scale window, min,
           max_step.down) while T still waits for cold workers that will serve later than
           a flip would: flip D's leaving workers into T and cancel as many of T's
           starting ones (T's count does not change)
    both need
      speed      a flip serves sooner than the cold start it replaces:
                   grow  flip_s < start_s        swap  flip_s < start_s - (t - newest ask)
      urgency    T falls short before that cold start would serve (Forecast.short_in:
                 0 when T is short now or misses its latency target; else when its forecast
                 need crosses its count, the policy's demand trend interpolated)
      surplus    grow: D proposed fewer than it has at every decision of the last
                 flip.window_s, each over a full metrics window (the flip's own
                 stabilization: undoing a flip costs a flip, not a start), and its forecast
                 need leaves the workers spare; D's down cooldown has run.  swap: D's own decision removes them.
      safety     D keeps max(min, 1) workers and one serving worker (never its last); a
                 prefill worker holding leased KV is not flipped (drains.py's order: the
                 cheapest to move first)
    at most max_step.down flips a decision

``start_s`` is the start-up the autoscaler observed (the median of its last scale-ups:
decision to the pool serving at that count), else the configured ``coupled.lead_s``. Both
pools' cooldowns run from a flip. Each flip is a :class:`Flip` with its inputs, as each
decision keeps its own; the decisions carry it (``Decision.flips``).

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
    move: str  # "grow" or "swap" (the module docstring)
    inputs: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        """One log line: the flip, its move and every input."""
        inputs = " ".join(f"{k}={v:.4g}" for k, v in self.inputs.items())
        return (f"autoscale flip {self.worker}: {self.source} -> {self.target} "
                f"({self.move}) | {inputs}")


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

    def newest(self, role: RoleName) -> float | None:
        """When the newest scale-up of ``role`` still starting was asked (None: none)."""
        asked = self._asked[role]
        return asked[-1][0] if asked else None

    def flipped_in(self, role: RoleName) -> None:
        """Workers flipped into ``role``: its pending asks would time a flip, not a start
        (dropped)."""
        self._asked[role] = []

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
             current: dict[RoleName, int], measured: bool) -> None:
        """Record whether each pool proposed fewer workers than it has at ``t``;
        ``measured``: the metrics window is full (until it is, no surplus counts: a
        window's first rates understate a demand that has not streamed yet)."""
        for role in ROLES:
            below = self._below[role]
            if not measured:
                below.clear()
                continue
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
        for taker in ROLES:
            donor: RoleName = "decode" if taker == "prefill" else "prefill"
            if taker not in forecast or donor not in forecast:
                continue
            flips = (self._grow(t, snap, decisions, proposals, forecast, stabilizer, taker,
                                donor)
                     or self._swap(t, snap, decisions, forecast, taker, donor))
            if flips:
                stabilizer.note_change(donor, t)
                stabilizer.note_change(taker, t)
                self.clock.flipped_in(taker)
                return decisions, flips
        return decisions, []

    def _grow(self, t: float, snap: Snapshot, decisions: dict[RoleName, Decision],
              proposals: dict[RoleName, Proposal], forecast: dict[RoleName, Forecast],
              stabilizer: Stabilizer, taker: RoleName, donor: RoleName) -> list[Flip]:
        cfg = self.config
        dt, dd = decisions[taker], decisions[donor]
        up = dt.desired - dt.current
        start_s = self.clock.seconds
        if up <= 0 or dd.desired > dd.current or not self._lasting(donor, t):
            return []
        short_in = forecast[taker].short_in(dt.current, cfg.tolerance)
        if not (cfg.flip.flip_s < start_s and short_in < start_s):
            return []
        if dd.desired == dd.current and stabilizer.since_change(donor, t) < cfg.cooldown.down_s:
            return []
        fd = forecast[donor]
        keep = max(proposals[donor].replicas, fd.now, fd.ahead, cfg.bounds(donor).min, 1)
        movable = self._movable(snap, donor, dd.current)
        n = min(up, dd.current - keep, cfg.max_step.down, len(movable))
        if n <= 0:
            return []
        removed = max(dd.current - dd.desired, n)
        decisions[taker] = replace(dt, flips=n, reason=f"{dt.reason}; flip in")
        decisions[donor] = replace(dd, desired=dd.current - removed, flips=-n,
                                   reason="flip out" if removed == n
                                   else f"{dd.reason}; flip out")
        inputs = {"start_s": start_s, "flip_s": cfg.flip.flip_s, "short_in_s": short_in,
                  "taker_up": float(up), "donor_spare": float(dd.current - keep)}
        return [Flip(t, w, donor, taker, "grow", dict(inputs)) for w in movable[:n]]

    def _swap(self, t: float, snap: Snapshot, decisions: dict[RoleName, Decision],
              forecast: dict[RoleName, Forecast], taker: RoleName, donor: RoleName
              ) -> list[Flip]:
        cfg = self.config
        dt, dd = decisions[taker], decisions[donor]
        down = dd.current - dd.desired
        starting = dt.current - len(snap.of(taker))
        asked = self.clock.newest(taker)
        if down <= 0 or dt.desired != dt.current or starting <= 0 or asked is None:
            return []
        left_s = self.clock.seconds - (t - asked)  # until the newest cold start serves
        short_in = forecast[taker].short_in(len(snap.of(taker)), cfg.tolerance)
        if not (cfg.flip.flip_s < left_s and short_in < left_s):
            return []
        movable = self._movable(snap, donor, dd.current)
        n = min(down, starting, len(movable))
        if n <= 0:
            return []
        decisions[taker] = replace(dt, flips=n, reason=f"{dt.reason}; flip in, cancel "
                                   f"{n} starting")
        decisions[donor] = replace(dd, flips=-n, reason=f"{dd.reason}; flip out")
        inputs = {"start_left_s": left_s, "flip_s": cfg.flip.flip_s, "short_in_s": short_in,
                  "taker_starting": float(starting), "donor_down": float(down)}
        return [Flip(t, w, donor, taker, "swap", dict(inputs)) for w in movable[:n]]

    def _movable(self, snap: Snapshot, donor: RoleName, current: int) -> list[str]:
        """Serving workers of ``donor`` a flip may take, cheapest to move first (never the
        last serving one)."""
        serving = len(snap.of(donor))
        return list(drain_options(donor, snap, current).order)[:max(0, serving - 1)]
