"""The host-sharing model (tandem/planner/sim/host.py): co-located prefill and decode workers slow
each other down, by hand-computed timings and against the one-step-at-a-time reference."""

from __future__ import annotations

import pytest

from tandem.planner.sim import ClusterSpec, simulate
from tandem.planner.sim.host import HostSharing, HostSharingError
from tandem.planner.workload import LengthMix, RequestKind, poisson
from tests.unit.planner.test_sim_reference import EVENTS, MIX, _same
from tests.unit.planner.test_sim_support import BASE, PER_ROW, PER_TOKEN, assert_clean, profile, req

SHARING = HostSharing(decode_slowdown=2.0, prefill_slowdown=1.5)
# the same at one row, less for bigger batches (as measured: docs/planner.md)
BY_ROWS = HostSharing(decode_slowdown=((1, 2.0), (4, 1.6), (8, 1.3)), prefill_slowdown=1.5)
# the prefill factor by prompt tokens (bench/step_overlap.prefill_length_table)
BY_TOKENS = HostSharing(decode_slowdown=2.0, prefill_slowdown=((64, 2.0), (1024, 1.2)))


def _remote(sharing: HostSharing | None = SHARING, p: int = 1, d: int = 1) -> ClusterSpec:
    return ClusterSpec(p, d, placement="remote", host_sharing=sharing)


def test_a_prefill_beside_a_stepping_decode_worker_runs_slower() -> None:
    """A streams (its decode worker steps throughout); B's prompt, queued meanwhile, takes
    prefill_slowdown times its step. A's own prompt ran beside an idle decode worker."""
    prof = profile()
    trace = [req(0.0, 16, 1000), req(0.5, 100, 1)]
    shared = simulate(_remote(), prof, trace)
    alone = simulate(_remote(None), prof, trace)
    assert_clean(shared)
    a, b = shared.outcomes
    assert a.ttft_s == pytest.approx(alone.outcomes[0].ttft_s, abs=1e-12)
    assert b.ttft_s == pytest.approx(1.5 * (BASE + PER_TOKEN * 100), abs=1e-12)


@pytest.mark.parametrize("tokens", [16, 100, 600, 3000])
def test_a_prefill_step_takes_the_factor_of_its_prompt_tokens(tokens: int) -> None:
    """As above with the prefill factor by prompt tokens: B's one-step prompt takes the
    table's factor at its length (linear between 64 and 1,024 tokens, the ends beyond; one
    step whatever its length)."""
    prof = profile(chunk=4096)
    shared = simulate(_remote(BY_TOKENS), prof, [req(0.0, 16, 1000), req(0.5, tokens, 1)])
    assert_clean(shared)
    factor = BY_TOKENS.prefill_factor(tokens)
    expected = {16: 2.0, 100: 2.0 - 0.8 * 36 / 960, 600: 2.0 - 0.8 * 536 / 960, 3000: 1.2}
    assert factor == pytest.approx(expected[tokens])
    step = BASE + PER_TOKEN * tokens
    assert shared.outcomes[1].ttft_s == pytest.approx(factor * step, abs=1e-12)


def test_a_one_point_prefill_table_is_one_factor() -> None:
    prof = profile(2e-7, capacity=20_000, seqs=8)
    trace = poisson(60, 8, MIX, seed=1)
    _same(simulate(_remote(HostSharing(2.0, ((256, 1.5),)), 2, 4), prof, trace, events=EVENTS),
          simulate(_remote(SHARING, 2, 4), prof, trace, events=EVENTS))


@pytest.mark.parametrize("sharing", [SHARING, BY_ROWS], ids=["one-factor", "by-rows"])
def test_decode_steps_stretch_from_the_boundary_after_the_prefill_starts(
        sharing: HostSharing) -> None:
    """A's one-row steps last s alone; B's prefill (one step, slowed 1.5x by A's steps)
    makes A's steps 2s (the one-row factor) from the first boundary at or after it starts
    until the first boundary at or after it ends. A's finish, walked step by step, is the
    reference."""
    prof = profile()
    s, prefill_b = BASE + PER_ROW, 1.5 * (BASE + PER_TOKEN * 100)
    result = simulate(_remote(sharing), prof, [req(0.0, 16, 200), req(0.3037, 100, 1)])
    assert_clean(result)
    a = result.outcomes[0]
    first = BASE + PER_TOKEN * 16  # A's prefill: the decode worker was idle
    t = first + 16 * 1000 / 1e9  # A's KV lands: its decode steps start
    begin, end = 0.3037, 0.3037 + prefill_b
    slow = False
    for _ in range(199):  # tokens 2..200, one step each; the factor switches at boundaries
        t += 2 * s if slow else s
        if not slow and begin <= t < end:
            slow = True
        elif slow and t >= end:
            slow = False
    assert a.ttft_s == pytest.approx(first, abs=1e-12)
    assert a.e2e_s == pytest.approx(t, abs=1e-9)
    assert a.itl_max_s == pytest.approx(2 * s, abs=1e-12)


def test_a_change_mid_step_keeps_the_prefill_work_left() -> None:
    """B's long prompt starts beside an idle decode worker; A's KV lands just after and its
    decode steps (slowed 2x by B's prefill) make the rest of B's step run 1.5x slower, and
    full speed again once A is done."""
    prof = profile(chunk=4096)
    p_a, p_b = BASE + PER_TOKEN * 16, BASE + PER_TOKEN * 2000
    transfer = 16 * 1000 / 1e9  # A's KV: 16 tokens of 1,000 bytes at 1 GB/s
    s = BASE + PER_ROW
    # A's prompt runs first; B (queued meanwhile) starts at p_a, A decodes from p_a + transfer.
    result = simulate(_remote(), prof, [req(0.0, 16, 3), req(1e-9, 2000, 1)])
    assert_clean(result)
    a, b = result.outcomes
    a_done = p_a + transfer + 2 * (2 * s)  # A's two decode steps, both beside B's prefill
    work_left = p_b - transfer - (a_done - p_a - transfer) / 1.5
    assert a.e2e_s == pytest.approx(a_done, abs=1e-9)
    assert b.arrival_s + b.ttft_s == pytest.approx(a_done + work_left, abs=1e-9)


@pytest.mark.parametrize("sharing", [SHARING, BY_ROWS], ids=["one-factor", "by-rows"])
@pytest.mark.parametrize("placement", ["adaptive", "remote"])
def test_macro_steps_match_one_step_at_a_time_with_host_sharing(
        placement: str, sharing: HostSharing) -> None:
    prof = profile(2e-7, capacity=20_000, seqs=8)
    trace = poisson(60, 8, MIX, seed=1)
    # The workers report the profile's costs: under host sharing a decode worker's online
    # fit (signals="fitted") sees a macro step's slowed run as one run where stepping one
    # step at a time sees each step, so the two fits differ slightly, and adaptive placement
    # (which prices every push on its link) can tip differently on a near tie.
    # test_sim_reference compares the fitted signals without sharing.
    cluster = ClusterSpec(2, 4, placement=placement, host_sharing=sharing, signals="profile")
    fast = simulate(cluster, prof, trace, events=EVENTS)
    slow = simulate(cluster, prof, trace, events=EVENTS, exact_steps=True)
    _same(fast, slow)
    assert_clean(fast)
    plain = simulate(ClusterSpec(2, 4, placement=placement, signals="profile"), prof, trace,
                     events=EVENTS)
    assert sum(o.e2e_s for o in fast.outcomes) > sum(o.e2e_s for o in plain.outcomes)


def test_unit_slowdowns_change_nothing() -> None:
    kind = RequestKind("k", prompt_tokens=(20, 900), output_tokens=(1, 120))
    trace = poisson(50, 6, LengthMix("m", ((kind, 1.0),)), seed=4)
    prof = profile(1e-7)
    cluster = ClusterSpec(2, 2)
    same = simulate(ClusterSpec(2, 2, host_sharing=HostSharing(1.0, 1.0)), prof, trace)
    _same(simulate(cluster, prof, trace), same)


def test_a_smaller_factor_for_bigger_batches_shortens_the_loaded_steps() -> None:
    """With the one-row factor the same, a table that slows big batches less finishes the
    same trace sooner than the one factor, and never sooner than no sharing at all."""
    prof = profile(2e-7, capacity=20_000, seqs=8)
    trace = poisson(60, 8, MIX, seed=1)

    def total(sharing: HostSharing | None) -> float:
        result = simulate(ClusterSpec(2, 4, placement="remote", host_sharing=sharing), prof,
                          trace, events=EVENTS)
        assert_clean(result)
        return sum(o.e2e_s for o in result.outcomes)

    assert total(None) < total(BY_ROWS) < total(SHARING)


def test_a_one_point_table_is_one_factor() -> None:
    prof = profile(2e-7, capacity=20_000, seqs=8)
    trace = poisson(60, 8, MIX, seed=1)
    table = HostSharing(((3, 2.0),), 1.5)
    _same(simulate(_remote(table, 2, 4), prof, trace, events=EVENTS),
          simulate(_remote(SHARING, 2, 4), prof, trace, events=EVENTS))


def test_the_decode_factor_is_linear_between_the_measured_batches() -> None:
    assert [BY_ROWS.decode_factor(r) for r in (1, 2, 4, 6, 8, 32)] == pytest.approx(
        [2.0, 2.0 - 0.4 / 3, 1.6, 1.45, 1.3, 1.3])
    assert HostSharing(((4, 1.8), (8, 1.2)), 1.0).decode_factor(1) == 1.8
    assert SHARING.decode_factor(17) == 2.0


def test_decode_factors_scale_but_stay_at_least_one() -> None:
    assert SHARING.decode_scaled(1.1) == HostSharing(2.2, 1.5)
    scaled = BY_ROWS.decode_scaled(0.8).decode_slowdown
    assert isinstance(scaled, tuple)
    assert [r for r, _ in scaled] == [1, 4, 8]
    assert [f for _, f in scaled] == pytest.approx([1.6, 1.28, 1.04])
    assert HostSharing(((1, 1.1), (4, 1.5)), 1.2).decode_scaled(0.5) == \
        HostSharing(((1, 1.0), (4, 1.0)), 1.2)


def test_slowdowns_are_checked_and_parsed() -> None:
    assert HostSharing.parse("2.1,1.8") == HostSharing(2.1, 1.8)
    assert HostSharing.parse("1:2/4:1.6/8:1.3,1.5") == BY_ROWS
    assert HostSharing.parse("2,64:2/1024:1.2") == BY_TOKENS
    for sharing in (SHARING, BY_ROWS, BY_TOKENS):
        assert HostSharing.parse(sharing.flag()) == sharing
    with pytest.raises(HostSharingError):
        HostSharing(0.5, 1.0)
    with pytest.raises(HostSharingError):
        HostSharing(((1, 2.0), (8, 0.9)), 1.0)
    with pytest.raises(HostSharingError, match="rise"):
        HostSharing(((8, 2.0), (4, 1.5)), 1.0)
    with pytest.raises(HostSharingError, match="rise"):
        HostSharing((), 1.0)
    with pytest.raises(HostSharingError, match="prefill tokens must rise"):
        HostSharing(1.0, ((512, 1.2), (64, 1.5)))
    with pytest.raises(HostSharingError):
        HostSharing(1.0, ((64, 1.5), (512, 0.9)))
    for bad in ("2", "1:2/x:1,1.5", "1:2:3,1.5"):
        with pytest.raises(HostSharingError):
            HostSharing.parse(bad)
