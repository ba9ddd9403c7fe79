"""Per-client bookkeeping: in-flight requests per connection and per API key."""

from __future__ import annotations

import pytest

from tandem.router.client_limits import ClientLimits, key_of
from tandem.router.errors import OverloadedError


def test_a_connection_at_its_bound_is_refused_and_others_are_not() -> None:
    limits = ClientLimits(per_connection=2, per_key=0, retry_after_ms=150)
    a1, a2 = limits.enter("a", None), limits.enter("a", None)
    with pytest.raises(OverloadedError, match="2 requests in flight on this connection") as err:
        limits.enter("a", None)
    assert err.value.retry_after_ms == 150 and limits.rejected == 1
    b = limits.enter("b", None)  # another connection still gets in
    limits.leave(a1)
    a3 = limits.enter("a", None)  # a slot came back
    for slot in (a2, a3, b):
        limits.leave(slot)
    assert limits.in_flight("a") == 0 and limits.in_flight("b") == 0
    assert not limits._by_connection  # an idle client leaves nothing behind


def test_a_key_is_bounded_across_connections() -> None:
    limits = ClientLimits(per_connection=0, per_key=1, retry_after_ms=100)
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
    limits = ClientLimits(per_connection=0, per_key=0, retry_after_ms=100)
    slots = [limits.enter("a", "k") for _ in range(1000)]
    for slot in slots:
        limits.leave(slot)
    assert limits.rejected == 0
