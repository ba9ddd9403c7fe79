"""The prefix-cache hash chain the engine, the workers' reports and the router share."""

from __future__ import annotations

from tandem.common.block_hash import block_hashes, hash_block, pack, unpack


def test_the_chain_names_a_block_and_everything_before_it() -> None:
    a = block_hashes(list(range(40)), 16)
    b = block_hashes(list(range(32)) + [99] * 20, 16)
    assert len(a) == 2 and a == b[:2] and len(b) == 3  # the partial tail is never hashed
    assert a[1] == hash_block(hash_block(None, list(range(16))), list(range(16, 32)))
    assert block_hashes([7] + list(range(1, 40)), 16)[1] != a[1]  # a changed first block
    assert block_hashes(list(range(64)), 16, max_blocks=2) == block_hashes(list(range(32)), 16)


def test_the_value_is_pinned() -> None:
    """No per-process salt (xxh3 of fixed bytes): a router and workers of one version on
    different machines agree; changing the function changes this value."""
    assert hash_block(None, list(range(16))) == 0xCD128BB7A8D0292A


def test_pack_round_trips_and_ignores_a_torn_tail() -> None:
    hashes = block_hashes(list(range(160)), 16)
    data = pack(hashes)
    assert len(data) == 8 * len(hashes)
    assert unpack(data) == frozenset(hashes)
    assert unpack(data + b"\x01\x02") == frozenset(hashes)
    assert unpack(b"") == frozenset()


def test_a_salt_heads_the_chain_and_separates_it() -> None:
    from tandem.common.block_hash import block_hashes, hash_block

    tokens = list(range(40))
    plain = block_hashes(tokens, 16)
    salted = block_hashes(tokens, 16, salt=7)
    other = block_hashes(tokens, 16, salt=8)
    assert len(salted) == 2 and not set(salted) & set(plain) and not set(salted) & set(other)
    assert salted[0] == hash_block(None, tokens[:16], 7)
    assert salted[1] == hash_block(salted[0], tokens[16:32])  # only the head is salted
    assert block_hashes(tokens, 16, salt=None) == plain
