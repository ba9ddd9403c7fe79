"""bench/ngram_replay: the replay's bookkeeping and the three proposal rules, on token lists."""

from __future__ import annotations

import pytest

from bench.engine.ngram_replay import make_rule, replay

#       0  1  2  3  4  5  6  7  8  9
CTX = [1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 1, 2, 3]  # (1, 2, 3) occurred at 0 and 5


def test_rules_pick_the_earliest_or_latest_match_and_their_lengths() -> None:
    assert make_rule("earliest", 4, 3, 1)(CTX, 10) == [4, 9, 1, 2]
    assert make_rule("latest", 4, 3, 1)(CTX, 10) == [5, 6, 1, 2]
    assert make_rule("latest-halving", 4, 4, 1)(CTX, 10) == [5, 6]  # a 3-gram of n_max 4
    assert make_rule("latest", 4, 3, 1)(CTX, 1) == [5]  # slots bound every rule
    assert make_rule("latest", 4, 3, 1)([1, 2, 3], 5) == []


def test_replay_counts_steps_and_costs() -> None:
    prompt, out = [7, 8, 9], [7, 8, 9, 7, 8]
    cost = {1: 10.0, 2: 10.0, 3: 15.0}.__getitem__

    def copy_two(ctx: list[int], slots: int) -> list[int]:  # drafts the next two from 3 back
        return ctx[len(ctx) - 3 : len(ctx) - 1][:slots] if len(ctx) >= 3 else []

    # t=0: drafts [7, 8] vs out [7, 8, ...] both accepted -> 3 tokens at 15 ms
    # t=3: drafts [7, 8][:1] vs out[3] = 7 accepted -> 2 tokens at 10 ms (slots = 1)
    res = replay([prompt], [out], copy_two, cost)
    assert res["tokens_per_step"] == pytest.approx(5 / 2)
    assert res["acceptance"] == pytest.approx(3 / 3)
    assert res["speedup"] == pytest.approx(5 * 10.0 / (15.0 + 10.0))
