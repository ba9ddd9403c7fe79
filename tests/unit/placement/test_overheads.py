"""PrefillOverheads: the extra seconds each worker's prefills take beyond the cost model's
prediction, learnt per push size and faded without new observations."""

from __future__ import annotations

import pytest

from tandem.placement.overheads import OVERHEAD_HALF_LIFE_S, PrefillOverheads


def test_remote_overhead_grows_with_the_blocks_a_push_carries() -> None:
    o = PrefillOverheads(weight=0.2)
    assert o.current(10) == {}
    # Measured extra = 5 ms + 1 ms per pushed block, pushes of alternating sizes.
    for i in range(200):
        blocks = (2, 64)[i % 2]
        o.observe("p", measured_s=1.0 + 0.005 + 0.001 * blocks, predicted_s=1.0,
                  pushed_blocks=blocks)
    assert o.current(2)["p"] == pytest.approx(0.007, abs=1e-4)
    assert o.current(64)["p"] == pytest.approx(0.069, abs=1e-3)
    assert o.current(0)["p"] == pytest.approx(0.005, abs=1e-3)
    o.forget("p")
    assert o.current(2) == {}


def test_overhead_of_same_sized_prefills_is_their_mean_and_never_answers_negative() -> None:
    o = PrefillOverheads(weight=0.5)
    o.observe("p", 0.3, 0.1, pushed_blocks=8)  # 0.2 s extra
    assert o.current(8)["p"] == pytest.approx(0.2)
    assert o.current(80)["p"] == pytest.approx(0.2)  # no slope from one size
    # Faster than predicted: -0.2 s goes into the mean as it is (clipped at 0 it would
    # leave 0.1 s of standing penalty from one fast and one slow prefill).
    o.observe("p", 0.1, 0.3, pushed_blocks=8)
    assert o.current(8)["p"] == pytest.approx(0.0)
    o.observe("p", 0.1, 0.3, pushed_blocks=8)  # the mean is now below 0: answered as 0
    assert o.current(8)["p"] == 0.0
    o.observe("p", 0.5, 0.3, pushed_blocks=8)  # -0.1 + 0.5 * (0.2 - -0.1)
    assert o.current(8)["p"] == pytest.approx(0.05)
    o.observe("p", 0.0, 0.0, pushed_blocks=100)
    assert min(o.current(b)["p"] for b in (0, 8, 100, 1000)) >= 0.0


def test_a_learnt_overhead_fades_without_new_observations() -> None:
    """An option the router stopped choosing teaches it nothing, so its figure fades (half
    every OVERHEAD_HALF_LIFE_S) until the option is tried again: one bad spell cannot keep
    it out for good."""
    o = PrefillOverheads(weight=0.5)
    o.observe("d0", 0.5, 0.1, pushed_blocks=4, now=100.0)  # 0.4 s beyond its prediction
    assert o.current(4)["d0"] == pytest.approx(0.4)  # no time given: as learnt
    assert o.current(4, now=100.0)["d0"] == pytest.approx(0.4)
    assert o.current(4, now=100.0 + OVERHEAD_HALF_LIFE_S)["d0"] == pytest.approx(0.2)
    assert o.current(4, now=100.0 + 3 * OVERHEAD_HALF_LIFE_S)["d0"] == pytest.approx(0.05)
    # a new observation renews it: the fit's mean, from then on
    o.observe("d0", 0.1, 0.1, pushed_blocks=4, now=400.0)
    assert o.current(4, now=400.0)["d0"] == pytest.approx(0.2)
    o.forget("d0")
    assert o.current(4, now=500.0) == {}
