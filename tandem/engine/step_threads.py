"""How many threads a fused CPU step runs on, chosen step by step from what steps measured.

A CPU worker may have two team sizes: ``narrow`` (its own cores) and ``wide`` (every core: a
decode worker borrowing an idle prefill worker's cores, or a colocated worker's whole share).
Wide is faster only while the other cores are really free. On a host where the router, the KV
transfer or a client also want CPU, a team as large as the core count waits at each of a
step's ~150 OpenMP barriers for whichever thread the OS descheduled, and a step can take ten
times what it takes on one thread. No fixed choice is right for every load, so both are
measured, per step size::

    choose(tokens)  -> narrow | wide    each arm's estimate for steps of this size (buckets of
                                        2^k query tokens): the mean of its last 8 step times
                                        there, the slowest left out
    observed(tokens, threads, seconds)  adds the step to its arm's times

Wide runs while its estimate beats narrow's by ``margin``. The losing arm is tried again after
``retry_s`` for a few consecutive steps (3 narrow, 8 wide: its stale times forgotten first;
a size's first wide step, when it loses to the first narrow one, is re-tried so at once),
an interval that doubles each time it loses again (up to ``max_retry_s``) and resets when it
wins. So a busy host costs a few slow steps per interval at most, and a host that frees up is
noticed at the next re-try (a re-try whose step takes over ``PROBE_GIVE_UP`` times the
winner's estimate is judged on that one step). Each size measures both arms before choosing:
another size's time says nothing of this one's. A wide step may need a lease (a prefill worker's idle
cores, tandem/worker/core_lending.py): without one it runs narrow.
"""

from __future__ import annotations

import math
import time
from collections import deque
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


WINDOW = 8  # the step times an arm's estimate for one size keeps
# Consecutive steps a re-try of the losing arm runs before it is judged: narrow's own cores
# are warm, 3 steps judge it. A wide team's first steps are slow while the cores it takes
# warm up (a lender's OpenMP threads spin on after its own step, the caches hold its data):
# one stream's wide steps after a prefill ran 6.7, 5.3, 4.5, then 3.5 ms against 4.9 ms
# narrow, so a 3-step re-try judged wide the loser (and doubled its interval) after every
# prefill; 8 steps see it settle.
PROBE_STEPS = 3
WIDE_PROBE_STEPS = 8
# A re-try step this many times slower than the winner's estimate ends the re-try at once: on
# a busy host a wide step can take ten times a narrow one, and three of them would cost more
# than the re-try can win back.
PROBE_GIVE_UP = 2.0


@dataclass(slots=True)
class _Arm:
    threads: int
    retry_s: float
    times: dict[int, deque[float]] = field(default_factory=dict)  # bucket -> recent seconds
    last: float = -math.inf  # when its last step ended
    steps: int = 0

    def guess(self, b: int) -> float | None:
        """Its estimate for steps of bucket ``b``: the mean of its recent step times there,
        the slowest left out once there are three (one stall does not decide, frequent ones
        do). None: it never ran one (another size's time cannot stand in)."""
        times = self.times.get(b)
        if not times:
            return None
        kept = sorted(times)[:-1] if len(times) >= 3 else list(times)
        return sum(kept) / len(kept)

    def record(self, b: int, seconds: float, fresh: bool) -> None:
        """Add a step time (``fresh``: forget this size's older times first)."""
        times = self.times.setdefault(b, deque(maxlen=WINDOW))
        if fresh:
            times.clear()
        times.append(seconds)


class AdaptiveThreads:
    """``narrow`` or ``wide`` threads per step, whichever measures faster (module docstring).
    ``wide_steps`` counts the steps that ran wide (a decode worker's borrowed steps)."""

    def __init__(self, narrow: int, wide: int, lease: Lease | None = None, *,
                 margin: float = 0.9, retry_s: float = 1.0, max_retry_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 1 <= narrow < wide:
            raise ValueError(f"need 1 <= narrow < wide threads (got {narrow}, {wide})")
        if not (0 < margin <= 1 and 0 < retry_s <= max_retry_s):
            raise ValueError("need 0 < margin <= 1 and 0 < retry_s <= max_retry_s")
        self.narrow, self.wide = _Arm(narrow, retry_s), _Arm(wide, retry_s)
        self._lease = lease
        self._margin, self._retry_s, self._max_retry_s = margin, retry_s, max_retry_s
        self._clock = clock
        self._held = False  # the step in flight holds a lease
        # A re-try of the losing arm in progress: (arm, bucket, steps it has run so far).
        self._probe: tuple[_Arm, int, int] | None = None
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
        if self._probe is not None and self._probe[1] == b:
            arm = self._probe[0]  # the re-try goes on
        elif ranked is None:  # measure each arm once for steps of this size: wide first
            arm = self.wide if self.wide.guess(b) is None else self.narrow
        else:
            arm, loser = ranked
            if now - loser.last >= loser.retry_s:
                arm = loser
                self._probe = (loser, b, 0)
        if arm is self.wide and self._lease is not None:
            known = self.wide.guess(b)
            hold = FIRST_HOLD_S if known is None else max(MIN_HOLD_S, 3 * known)
            self._held = self._lease.try_borrow(hold)
            if not self._held:  # the lender computes: narrow, and the re-try waits
                arm, self._probe = self.narrow, None
        return arm.threads

    def observed(self, tokens: int, threads: int, seconds: float) -> None:
        if self._held:
            self._held = False
            self._lease.give_back()  # type: ignore[union-attr]
        arm = self.wide if threads == self.wide.threads else self.narrow
        b = bucket(tokens)
        probe = self._probe
        probing = probe is not None and probe[0] is arm and probe[1] == b
        first = not arm.times.get(b)  # its first step of this size
        # A re-try's first step forgets the arm's older times here: they are stale.
        arm.record(b, seconds, fresh=probing and probe[2] == 0)  # type: ignore[index]
        arm.last, arm.steps = self._clock(), arm.steps + 1
        if arm is self.wide:
            self.wide_steps += 1
        if first and not probing:
            ranked = self._winner(b)
            if ranked is not None and ranked[1] is self.wide:
                # Each arm has one step of this size, and wide's may have run on cold cores
                # (module docstring): its re-try, a run of WIDE_PROBE_STEPS, comes at once.
                self.wide.last = -math.inf
        if not probing:
            return
        done = probe[2] + 1  # type: ignore[index]
        other = (self.narrow if arm is self.wide else self.wide).guess(b)
        hopeless = other is not None and seconds > PROBE_GIVE_UP * other
        length = WIDE_PROBE_STEPS if arm is self.wide else PROBE_STEPS
        if done < length and not hopeless:
            self._probe = (arm, b, done)
            return
        self._probe = None  # judged: did it lose again?
        ranked = self._winner(b)
        lost = ranked is not None and ranked[1] is arm
        arm.retry_s = min(2 * arm.retry_s, self._max_retry_s) if lost else self._retry_s
