"""Prefix affinity: the chained prefix hashes and the bounded LRU of which worker served them."""

from __future__ import annotations

from tandem.placement.affinity import PrefixAffinity, prefix_hashes


def test_prefix_hashes_chain_and_share_prefixes() -> None:
    a = prefix_hashes(list(range(40)), 16)
    b = prefix_hashes(list(range(32)) + [99] * 20, 16)
    assert len(a) == 2 and len(b) == 3
    assert a == b[:2]
    assert prefix_hashes(list(range(15)), 16) == []
    assert prefix_hashes([1] + list(range(1, 40)), 16)[0] != a[0]


def test_affinity_longest_match_first() -> None:
    aff = PrefixAffinity(100)
    long = prefix_hashes(list(range(64)), 16)
    aff.record(long[:1], "x")
    aff.record(long, "y")  # y now owns every prefix, including the first block
    aff.record(long[:1], "x")
    assert aff.lookup(long) == [("y", 4), ("x", 1)]
    assert aff.lookup(prefix_hashes(list(range(100, 200)), 16)) == []


def test_affinity_is_a_bounded_lru() -> None:
    aff = PrefixAffinity(3)
    aff.record([1, 2], "a")
    aff.record([3], "b")
    aff.lookup([1])  # lookups do not refresh: only serving does
    aff.record([4], "c")
    assert len(aff) == 3
    assert aff.lookup([1]) == [] and aff.lookup([2]) == [("a", 1)]


def test_affinity_forget() -> None:
    aff = PrefixAffinity(10)
    aff.record([1, 2], "a")
    aff.record([3], "b")
    aff.forget("a")
    assert aff.lookup([1, 2, 3]) == [("b", 3)]
