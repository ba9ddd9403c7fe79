"""How many threads a fused CPU step runs on, chosen step by step from what steps measured.

A CPU worker may have two team sizes: ``narrow`` (its own cores) and ``wide`` (every core: a
decode worker borrowing an idle prefill worker's cores, or a colocated worker's whole share).
Wide is faster only while the other cores are really free. On a host where the router, the KV
transfer or a client also want CPU, a team as large as the core count waits at each of a
step's ~150 OpenMP barriers for whichever thread the OS descheduled, and a step can take ten
times what it takes on one thread. No fixed choice is right for every load, so both are
measured, per step size::

    choose(tokens)  -> narrow | wide    each arm's estimate for steps of this size
                                        (EWMA of step seconds, buckets of 2^k query tokens)
    observed(tokens, threads, seconds)  folds the step into its arm's estimate

Wide runs while its estimate beats narrow's by ``margin``. The losing arm is tried again after
``retry_s``, an interval that doubles each time it loses again (up to ``max_retry_s``) and
resets when it wins; a re-try's time replaces the arm's stale estimate. So a busy host costs
one slow step per interval at most, and a host that frees up is noticed at the next re-try. A wide step may need a lease (a prefill worker's idle
cores, tandem/worker/core_lending.py): without one it runs narrow.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

MIN_HOLD_S = 0.05  # a borrowed step's lease covers at least this, and 3x its estimate
FIRST_HOLD_S = 0.5  # before any wide step was measured


class StepThreads(Protocol):
    """The model runner's per-step thread rule (``ModelRunner.step_threads``)."""

    def choose(self, tokens: int) -> int:
        """Threads for a step of ``tokens`` query tokens."""
        ...

    def observed(self, tokens: int, threads: int, seconds: float) -> None:
        """The step ``choose`` was asked about ran on ``threads`` threads for ``seconds``."""
        ...


class Lease(Protocol):
    """Cores lent for one step (tandem/worker/core_lending.py's ``CoreBorrower``)."""

    def try_borrow(self, hold_s: float) -> bool: ...

    def give_back(self) -> None: ...


class FixedThreads:
    """Every step on ``threads`` threads (the rule when there is nothing to choose)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads

    def choose(self, tokens: int) -> int:
        return self.threads

    def observed(self, tokens: int, threads: int, seconds: float) -> None:
        return None


class LeasedThreads:
    """Every step on ``wide`` threads whenever ``lease`` grants them, else on ``narrow``: a
    borrower that does not measure (``--step-threads fixed`` with a core share)."""

    def __init__(self, narrow: int, wide: int, lease: Lease) -> None:
        if not 1 <= narrow < wide:
            raise ValueError(f"need 1 <= narrow < wide threads (got {narrow}, {wide})")
        self.narrow, self.wide, self._lease = narrow, wide, lease
        self._held = False
        self.wide_steps = 0

    @property
    def sizes(self) -> tuple[int, int]:
        """(narrow, wide) threads."""
        return self.narrow, self.wide

    def choose(self, tokens: int) -> int:
        self._held = self._lease.try_borrow(FIRST_HOLD_S)
        return self.wide if self._held else self.narrow

    def observed(self, tokens: int, threads: int, seconds: float) -> None:
        if self._held:
            self._held = False
            self.wide_steps += 1
            self._lease.give_back()


def bucket(tokens: int) -> int:
    """Steps of 1, 2-3, 4-7, ... query tokens share an estimate."""
    return max(tokens, 1).bit_length()


@dataclass(slots=True)
class _Arm:
    threads: int
    retry_s: float
    estimate: dict[int, float] = field(default_factory=dict)  # bucket -> EWMA seconds
    last: float = -math.inf  # when its last step ended
    steps: int = 0

    def guess(self, b: int) -> float | None:
        """Its estimate for steps of bucket ``b`` (None: it never ran one: a step's time
        depends on its size too much for another bucket's to stand in)."""
        return self.estimate.get(b)


class AdaptiveThreads:
    """``narrow`` or ``wide`` threads per step, whichever measures faster (module docstring).
    ``wide_steps`` counts the steps that ran wide (a decode worker's borrowed steps)."""

    def __init__(self, narrow: int, wide: int, lease: Lease | None = None, *,
                 margin: float = 0.9, retry_s: float = 1.0, max_retry_s: float = 30.0,
                 alpha: float = 0.25, clock: Callable[[], float] = time.monotonic) -> None:
        if not 1 <= narrow < wide:
            raise ValueError(f"need 1 <= narrow < wide threads (got {narrow}, {wide})")
        if not (0 < margin <= 1 and 0 < retry_s <= max_retry_s and 0 < alpha <= 1):
            raise ValueError("need 0 < margin <= 1, 0 < retry_s <= max_retry_s, 0 < alpha <= 1")
        self.narrow, self.wide = _Arm(narrow, retry_s), _Arm(wide, retry_s)
        self._lease = lease
        self._margin, self._retry_s, self._max_retry_s = margin, retry_s, max_retry_s
        self._alpha, self._clock = alpha, clock
        self._held = False  # the step in flight holds a lease
        self._trying: _Arm | None = None  # the step in flight re-tries this losing arm
        self.wide_steps = 0

    @property
    def sizes(self) -> tuple[int, int]:
        """(narrow, wide) threads."""
        return self.narrow.threads, self.wide.threads

    def _winner(self, b: int) -> tuple[_Arm, _Arm] | None:
        """(winner, loser) for bucket ``b``; None while an arm has never run."""
        n, w = self.narrow.guess(b), self.wide.guess(b)
        if n is None or w is None:
            return None
        return (self.wide, self.narrow) if w < self._margin * n else (self.narrow, self.wide)

    def choose(self, tokens: int) -> int:
        b, now = bucket(tokens), self._clock()
        ranked = self._winner(b)
        self._trying = None
        if ranked is None:  # measure each arm once for steps of this size: wide first
            arm = self.wide if self.wide.guess(b) is None else self.narrow
        else:
            arm, loser = ranked
            if now - loser.last >= loser.retry_s:
                arm = self._trying = loser
        if arm is self.wide and self._lease is not None:
            known = self.wide.guess(b)
            hold = FIRST_HOLD_S if known is None else max(MIN_HOLD_S, 3 * known)
            if not self._lease.try_borrow(hold):
                arm, self._trying = self.narrow, None
            else:
                self._held = True
        return arm.threads

    def observed(self, tokens: int, threads: int, seconds: float) -> None:
        if self._held:
            self._held = False
            self._lease.give_back()  # type: ignore[union-attr]
        arm = self.wide if threads == self.wide.threads else self.narrow
        b = bucket(tokens)
        old = arm.estimate.get(b)
        retry = self._trying is arm  # its estimate is at least retry_s old: start afresh
        arm.estimate[b] = (seconds if old is None or retry
                           else old + self._alpha * (seconds - old))
        arm.last, arm.steps = self._clock(), arm.steps + 1
        if arm is self.wide:
            self.wide_steps += 1
        if retry:  # a re-try of the losing arm: did it lose again?
            ranked = self._winner(b)
            lost = ranked is not None and ranked[1] is arm
            arm.retry_s = min(2 * arm.retry_s, self._max_retry_s) if lost else self._retry_s
            self._trying = None
