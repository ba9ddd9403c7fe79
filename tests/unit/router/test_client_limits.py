"""Per-client bookkeeping by cost: sequences and prompt tokens per connection and per key."""

from __future__ import annotations

import pytest

from tandem.router.client_limits import ClientLimits, key_of
from tandem.router.cost import NOTHING, Cost
from tandem.router.errors import InvalidRequestError, OverloadedError


def test_a_connection_at_its_bound_is_refused_and_others_are_not() -> None:
    limits = ClientLimits(per_connection=Cost(2, 0), per_key=NOTHING, retry_after_ms=150)
    a1, a2 = limits.enter("a", None), limits.enter("a", None)
    with pytest.raises(OverloadedError, match="2 sequences in flight on this connection") as err:
        limits.enter("a", None)
    assert err.value.retry_after_ms == 150 and limits.rejected == 1
    b = limits.enter("b", None)  # another connection still gets in
    limits.leave(a1)
    a3 = limits.enter("a", None)  # a slot came back
    for slot in (a2, a3, b):
        limits.leave(slot)
    assert limits.in_flight("a") == NOTHING and limits.in_flight("b") == NOTHING
    assert not limits._by_connection  # an idle client leaves nothing behind


def test_a_request_grows_from_one_sequence_to_its_whole_cost() -> None:
    limits = ClientLimits(per_connection=Cost(8, 100), per_key=NOTHING, retry_after_ms=10)
    slot = limits.enter("a", None)
    assert limits.in_flight("a") == Cost(1, 0)  # before the body is read
    limits.grow(slot, Cost(6, 40))  # 2 prompts x 3 sequences, 40 prompt tokens
    assert limits.in_flight("a") == Cost(6, 40)
    other = limits.enter("a", None)
    with pytest.raises(OverloadedError, match="8 sequences"):
        limits.grow(other, Cost(3, 1))  # 6 + 3 > 8
    with pytest.raises(OverloadedError, match="100 prompt tokens"):
        limits.grow(other, Cost(1, 61))  # 40 + 61 > 100
    assert limits.in_flight("a") == Cost(7, 40)  # a refused grow keeps what it held
    limits.grow(other, Cost(2, 60))
    assert limits.in_flight("a") == Cost(8, 100)
    limits.leave(slot)
    limits.leave(other)
    assert limits.in_flight("a") == NOTHING and limits.rejected == 2


def test_a_cost_over_a_whole_bound_is_invalid_naming_the_flag() -> None:
    limits = ClientLimits(per_connection=Cost(4, 100), per_key=Cost(2, 50), retry_after_ms=10)
    with limits.hold("a", None) as slot:
        with pytest.raises(InvalidRequestError,
                           match=r"5 sequences \(at most 4\).*--max-inflight-per-connection"):
            limits.grow(slot, Cost(5, 1))
        with pytest.raises(InvalidRequestError, match="--max-inflight-tokens-per-connection"):
            limits.grow(slot, Cost(1, 101))
    key = key_of("Bearer sk")
    with limits.hold("a", key) as slot:
        with pytest.raises(InvalidRequestError, match="--max-inflight-per-key"):
            limits.grow(slot, Cost(3, 1))
        with pytest.raises(InvalidRequestError, match="--max-inflight-tokens-per-key"):
            limits.grow(slot, Cost(1, 51))
    assert limits.rejected == 0 and not limits._by_key and not limits._by_connection


def test_a_key_is_bounded_across_connections() -> None:
    limits = ClientLimits(per_connection=NOTHING, per_key=Cost(1, 0), retry_after_ms=100)
    key = key_of("Bearer sk-one")
    assert key == key_of("bearer  sk-one ") and key != key_of("Bearer sk-two")
    assert key_of(None) is None and key_of("Basic abc") is None
    with limits.hold("c1", key):
        with pytest.raises(OverloadedError, match="for this API key"):
            limits.enter("c2", key)
        with limits.hold("c2", key_of("Bearer sk-two")), limits.hold("c3", None):
            pass  # another key, or none: not this key's bound
    with limits.hold("c2", key):  # released on the way out
        pass


def test_zero_turns_a_bound_off() -> None:
    limits = ClientLimits(per_connection=NOTHING, per_key=NOTHING, retry_after_ms=100)
    slots = [limits.enter("a", "k", Cost(100, 10**6)) for _ in range(1000)]
    for slot in slots:
        limits.leave(slot)
    assert limits.rejected == 0
