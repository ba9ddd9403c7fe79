"""tandem/engine/step_threads.py: each step runs narrow or wide, whichever measured faster for
steps of its size; the loser is re-tried at doubling intervals; a wide step under a lease runs
only when the lease is granted, and gives it back when the step ends."""

from __future__ import annotations

import pytest

from tandem.engine.step_threads import (
    PROBE_STEPS,
    WIDE_PROBE_STEPS,
    AdaptiveThreads,
    FixedThreads,
    bucket,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Lease:
    def __init__(self) -> None:
        self.open = True
        self.held = 0
        self.holds: list[float] = []

    def try_borrow(self, hold_s: float) -> bool:
        if self.open:
            self.held += 1
            self.holds.append(hold_s)
        return self.open

    def give_back(self) -> None:
        assert self.held == 1
        self.held -= 1


def run(rule: AdaptiveThreads, clock: Clock, tokens: int, cost: dict[int, float]) -> int:
    """One step: the rule chooses, the step takes ``cost[threads]`` seconds."""
    threads = rule.choose(tokens)
    clock.now += cost[threads]
    rule.observed(tokens, threads, cost[threads])
    return threads


def test_it_settles_on_the_faster_team_and_follows_the_host() -> None:
    clock = Clock()
    rule = AdaptiveThreads(1, 2, clock=clock)
    idle_host = {1: 0.020, 2: 0.012}
    chosen = [run(rule, clock, 8, idle_host) for _ in range(50)]
    assert chosen[:2] == [2, 1]  # each arm measured once, wide first
    assert chosen[2:].count(2) >= 45  # wide wins on an idle host; narrow re-tried rarely
    busy_host = {1: 0.020, 2: 0.200}  # a descheduled thread stalls every barrier
    chosen = [run(rule, clock, 8, busy_host) for _ in range(2000)]
    assert chosen[-300:].count(2) <= 6  # back on one thread; wide re-tried ever more rarely
    # each re-try of wide is one step (ten times the narrow estimate: judged at once); the
    # re-tries start ever further apart
    starts = [i for i, t in enumerate(chosen) if t == 2 and (i == 0 or chosen[i - 1] == 1)]
    assert all(chosen[i:i + 2] == [2, 1] for i in starts[1:])
    gaps = [b - a for a, b in zip(starts[1:-1], starts[2:], strict=True)]
    assert len(gaps) >= 3 and gaps == sorted(gaps)  # the interval doubles while wide loses
    chosen = [run(rule, clock, 8, idle_host) for _ in range(3000)]
    assert chosen[-100:].count(2) >= 90  # the host freed up: noticed at the next re-try


def test_steps_of_different_sizes_keep_their_own_estimates() -> None:
    clock = Clock()
    rule = AdaptiveThreads(1, 2, clock=clock)
    small = {1: 0.010, 2: 0.015}  # one row: the team's barriers cost more than they save
    big = {1: 0.400, 2: 0.210}  # a prompt chunk: two cores nearly halve it
    for _ in range(200):
        run(rule, clock, 1, small)
        run(rule, clock, 512, big)
    assert rule.choose(1) == 1
    rule.observed(1, 1, 0.010)
    assert rule.choose(512) == 2
    assert bucket(1) != bucket(512) and bucket(300) == bucket(511)


def test_a_wide_step_needs_the_lease_and_gives_it_back() -> None:
    clock, lease = Clock(), Lease()
    rule = AdaptiveThreads(1, 2, lease, clock=clock)
    cost = {1: 0.020, 2: 0.010}
    assert run(rule, clock, 4, cost) == 2 and lease.held == 0
    assert lease.holds == [0.5]  # nothing measured yet: a generous lease
    wide = 1 + sum(run(rule, clock, 4, cost) == 2 for _ in range(20))
    assert lease.holds[-1] == pytest.approx(0.05)  # 3x the estimate, at least 50 ms
    lease.open = False  # the lender computes
    assert [run(rule, clock, 4, cost) for _ in range(5)] == [1] * 5 and lease.held == 0
    lease.open = True
    assert run(rule, clock, 4, cost) == 2
    assert rule.wide_steps == wide + 1 == len(lease.holds)


def test_bad_settings_are_refused_and_fixed_threads_is_fixed() -> None:
    for narrow, wide in ((0, 2), (2, 2), (3, 2)):
        with pytest.raises(ValueError):
            AdaptiveThreads(narrow, wide)
    with pytest.raises(ValueError):
        AdaptiveThreads(1, 2, margin=0)
    with pytest.raises(ValueError):
        AdaptiveThreads(1, 2, retry_s=5, max_retry_s=1)
    fixed = FixedThreads(3)
    assert fixed.choose(1) == fixed.choose(999) == 3


def test_leased_threads_borrow_whenever_granted_and_give_back() -> None:
    from tandem.engine.step_threads import LeasedThreads

    lease = Lease()
    rule = LeasedThreads(1, 2, lease)
    assert rule.choose(4) == 2 and lease.held == 1
    rule.observed(4, 2, 0.5)  # however slow: it does not measure
    assert lease.held == 0 and rule.choose(4) == 2
    rule.observed(4, 2, 0.5)
    lease.open = False
    assert rule.choose(4) == 1
    rule.observed(4, 1, 0.01)
    assert rule.wide_steps == 2 and lease.held == 0


def test_a_new_step_size_measures_both_teams_before_choosing() -> None:
    """Another size's estimate never stands in: a prompt step's time says nothing of a
    one-row decode step's (taking it for one kept a single stream on one thread)."""
    clock = Clock()
    rule = AdaptiveThreads(1, 2, clock=clock)
    run(rule, clock, 128, {1: 0.045, 2: 0.025})  # the prompt: wide first
    decode = {1: 0.006, 2: 0.004}
    first = [run(rule, clock, 1, decode) for _ in range(4)]
    assert first[:2] == [2, 1] and first[2:] == [2, 2]  # each once, then the faster


def test_one_stalled_step_does_not_decide_but_frequent_stalls_do() -> None:
    clock = Clock()
    rule = AdaptiveThreads(1, 2, clock=clock)
    for _ in range(10):
        run(rule, clock, 1, {1: 0.006, 2: 0.004})
    assert run(rule, clock, 1, {1: 0.006, 2: 0.050}) == 2  # one wide step stalls
    assert [run(rule, clock, 1, {1: 0.006, 2: 0.004}) for _ in range(3)] == [2, 2, 2]
    stalls = [run(rule, clock, 1, {1: 0.006, 2: 0.004 if i % 2 else 0.030}) for i in range(8)]
    assert stalls[-1] == 1  # half the wide steps stall: one thread is faster on average


def test_a_retry_runs_a_few_steps_unless_its_first_is_hopeless() -> None:
    """A re-try of the losing wide arm is judged on WIDE_PROBE_STEPS steps while they are close
    to the winner's estimate, on its first step when that takes over PROBE_GIVE_UP times it."""
    for wide_s, run_length in ((0.026, WIDE_PROBE_STEPS), (0.200, 1)):
        clock = Clock()
        rule = AdaptiveThreads(1, 2, clock=clock)
        host = {1: 0.020, 2: wide_s}
        chosen = [run(rule, clock, 8, host) for _ in range(400)]
        starts = [i for i, t in enumerate(chosen) if i > 0 and t == 2 and chosen[i - 1] == 1]
        assert len(starts) >= 3
        assert all(chosen[i:i + run_length] == [2] * run_length
                   and chosen[i + run_length] == 1 for i in starts), wide_s


def test_a_borrowed_team_that_warms_up_over_a_few_steps_wins_its_retry() -> None:
    """Wide steps right after the lender's own work are slow for a few steps (its threads
    still spin, the caches hold its data), then settle well below narrow's: the re-try sees
    them settle and wide wins, instead of losing on its cold steps every time."""
    clock = Clock()
    rule = AdaptiveThreads(1, 2, clock=clock)
    ramp = [0.0067, 0.0053, 0.0045]  # a wide run's first steps; then 3.5 ms

    def step(run_index: int) -> int:
        threads = rule.choose(1)
        seconds = 0.0049 if threads == 1 else (
            ramp[run_index] if run_index < len(ramp) else 0.0035)
        clock.now += seconds
        rule.observed(1, threads, seconds)
        return threads

    chosen: list[int] = []
    wide_run = 0
    for _ in range(1500):
        t = step(wide_run)
        wide_run = wide_run + 1 if t == 2 else 0
        chosen.append(t)
    assert chosen[-200:].count(2) >= 190  # wide won a re-try and kept winning


def test_a_first_wide_step_on_cold_cores_is_retried_at_once() -> None:
    """A step size's first wide step may run on cold borrowed cores (slow for a few steps):
    when it loses to the first narrow step, wide's re-try (WIDE_PROBE_STEPS long) follows at
    once, not a re-try interval later, and wins once the cores settle below narrow's time. On
    a busy host that re-try's first step is hopeless and ends it: one step more."""
    clock = Clock()
    rule = AdaptiveThreads(1, 2, clock=clock)
    ramp = iter([0.0067, 0.0053, 0.0045])
    chosen = []
    for _ in range(2 + WIDE_PROBE_STEPS + 20):
        threads = rule.choose(1)
        seconds = 0.0049 if threads == 1 else next(ramp, 0.0035)
        clock.now += seconds
        rule.observed(1, threads, seconds)
        chosen.append(threads)
    assert chosen[:2] == [2, 1] and chosen[2:] == [2] * (WIDE_PROBE_STEPS + 20)
    clock = Clock()
    rule = AdaptiveThreads(1, 2, clock=clock)
    busy = [run(rule, clock, 1, {1: 0.005, 2: 0.050}) for _ in range(12)]
    assert busy == [2, 1, 2] + [1] * 9


def test_a_retry_of_narrow_runs_fewer_steps() -> None:
    """Narrow's own cores need no warming: its re-tries (wide winning) are PROBE_STEPS long."""
    clock = Clock()
    rule = AdaptiveThreads(1, 2, clock=clock)
    host = {1: 0.020, 2: 0.012}
    chosen = [run(rule, clock, 8, host) for _ in range(2000)]
    starts = [i for i, t in enumerate(chosen) if i > 2 and t == 1 and chosen[i - 1] == 2]
    assert len(starts) >= 3 and PROBE_STEPS < WIDE_PROBE_STEPS
    assert all(chosen[i:i + PROBE_STEPS] == [1] * PROBE_STEPS
               and chosen[i + PROBE_STEPS] == 2 for i in starts)
