"""Hand-computed timings of the simulator: one request, packed prefill, local prefill."""

from __future__ import annotations

import pytest

from tandem.planner.sim import ClusterSpec, simulate
from tests.unit.planner.test_sim_support import (
    BASE,
    PER_ROW,
    PER_TOKEN,
    assert_clean,
    profile,
    req,
)

REMOTE = ClusterSpec(1, 1, placement="remote")
LOCAL = ClusterSpec(0, 1)


def test_one_request_alone_remote() -> None:
    c = 1e-5  # per context token
    prof = profile(c, latency=0.005)
    result = simulate(REMOTE, prof, [req(1.0, 100, 5)])
    assert_clean(result)
    o = result.outcomes[0]
    prefill = BASE + PER_TOKEN * 100 + c * 100 * 101 / 2  # one step: 5,050 query-key pairs
    assert o.ttft_s == pytest.approx(prefill + 0.005, abs=1e-12)
    transfer = 0.005 + 100 * 1000 / 1e9
    # Four decode steps, one row, context 101..104 (prompt + tokens so far).
    steps = [BASE + PER_ROW + c * (101 + i) for i in range(4)]
    assert o.e2e_s == pytest.approx(prefill + transfer + sum(steps), abs=1e-12)
    # The first gap runs from the first token at the router to the end of D's first step.
    assert o.tpot_s == pytest.approx((transfer - 0.005 + sum(steps)) / 4, abs=1e-12)
    assert o.itl_max_s == pytest.approx(transfer - 0.005 + steps[0], abs=1e-12)
    assert o.pushed_bytes == 100 * 1000
    assert (o.decision, o.reason) == ("remote", "configured")
    assert (o.prefill_endpoint, o.decode_endpoint) == ("p00000", "d00000")
    assert result.decisions == {("remote", "configured"): 1}


def test_decode_step_time_is_the_tpot_without_transfer() -> None:
    result = simulate(REMOTE, profile(bandwidth=1e18), [req(0.0, 64, 11)])
    assert result.outcomes[0].tpot_s == pytest.approx(BASE + PER_ROW, rel=1e-9)
    assert_clean(result)


def test_two_prompts_packed_in_one_prefill_step() -> None:
    c = 1e-7
    prof = profile(c, chunk=512)
    result = simulate(REMOTE, prof, [req(0.0, 600, 2), req(0.001, 200, 2)])
    assert_clean(result)
    a, b = result.outcomes
    step1 = BASE + PER_TOKEN * 512 + c * 512 * 513 / 2  # A's first chunk alone
    # A's last 88 tokens and all of B share the second step (B arrived during the first);
    # A's chunk attends to its 512 earlier tokens too.
    step2 = BASE + PER_TOKEN * 288 + c * (88 * 512 + 88 * 89 / 2 + 200 * 201 / 2)
    assert a.ttft_s == pytest.approx(step1 + step2, abs=1e-12)
    assert b.arrival_s + b.ttft_s == pytest.approx(a.arrival_s + a.ttft_s, abs=1e-12)


def test_local_prefill_stalls_the_running_rows_by_its_chunk() -> None:
    prof = profile(chunk=512)
    result = simulate(LOCAL, prof, [req(0.0, 32, 50), req(0.2, 400, 2)])
    assert_clean(result)
    a, b = result.outcomes
    assert (a.decision, a.reason) == ("local", "colocated")
    a_first = BASE + PER_TOKEN * 32  # A's own prefill: no rows yet
    assert a.ttft_s == pytest.approx(a_first, abs=1e-12)
    plain = BASE + PER_ROW
    k = -(-(0.2 - a_first) // plain)  # plain steps until the first boundary after B arrives
    boundary = a_first + k * plain
    mixed = BASE + PER_ROW + PER_TOKEN * 400  # A's row plus B's whole prompt in one step
    assert b.ttft_s == pytest.approx(boundary + mixed - 0.2, abs=1e-9)
    assert a.itl_max_s == pytest.approx(mixed, abs=1e-12)
    # A's 49 decode steps: k plain, the mixed one, one with B's row, the rest plain.
    rest = 49 - k - 2
    finish = boundary + mixed + (BASE + 2 * PER_ROW) + rest * plain
    assert a.e2e_s == pytest.approx(finish, abs=1e-9)


def test_one_token_request_finishes_at_its_first_token() -> None:
    result = simulate(REMOTE, profile(), [req(0.0, 50, 1)])
    o = result.outcomes[0]
    assert o.completed and o.tpot_s == 0.0 and o.e2e_s == o.ttft_s
    assert_clean(result)


def test_serving_overheads_add_to_every_step_and_to_the_first_token() -> None:
    from dataclasses import replace

    plain = profile()
    served = replace(plain, serving_step_s=0.004, serving_request_s=0.05)
    a = simulate(LOCAL, plain, [req(0.0, 100, 5)]).outcomes[0]
    result = simulate(LOCAL, served, [req(0.0, 100, 5)])
    assert_clean(result)
    b = result.outcomes[0]
    assert b.ttft_s == pytest.approx(a.ttft_s + 0.004 + 0.05, abs=1e-12)  # 1 step + request
    # four decode steps, each 4 ms longer; the first token reached the client 50 ms late
    assert b.e2e_s == pytest.approx(a.e2e_s + 5 * 0.004, abs=1e-12)
    assert b.tpot_s == pytest.approx((b.e2e_s - b.ttft_s) / 4, abs=1e-12)


def test_steps_with_prompt_tokens_take_the_serving_prompt_scale() -> None:
    """A step that carries prompt tokens lasts ``serving_prompt_scale`` times what the rest
    of the model gives it (serving overhead included); decode-only steps keep their length.
    Locally: the prompt's own step, then a mixed step beside a running row; remotely: every
    prefill worker step."""
    from dataclasses import replace

    plain = profile()
    scaled = replace(plain, serving_prompt_scale=1.5, serving_step_s=0.002)
    base = replace(plain, serving_step_s=0.002)
    trace = [req(0.0, 100, 5)]
    a = simulate(LOCAL, base, trace).outcomes[0]
    result = simulate(LOCAL, scaled, trace)
    assert_clean(result)
    b = result.outcomes[0]
    step = BASE + PER_TOKEN * 100 + 0.002
    assert (a.ttft_s, b.ttft_s) == pytest.approx((step, 1.5 * step), abs=1e-12)
    assert b.tpot_s == pytest.approx(a.tpot_s, abs=1e-12)  # four decode steps: unscaled
    remote = simulate(REMOTE, base, trace, prefill_profile=scaled)
    assert_clean(remote)
    assert remote.outcomes[0].ttft_s == pytest.approx(1.5 * step, abs=1e-12)
