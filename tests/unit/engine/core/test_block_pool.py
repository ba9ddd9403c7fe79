"""BlockPool and KVCacheManager: pure bookkeeping, no torch."""

from __future__ import annotations

from tandem.common.block_hash import hash_block
from tandem.engine.core.block_pool import BlockPool
from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.request import Request
from tandem.engine.sampling_params import SamplingParams


def _req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams())


def test_allocate_and_free_round_trip() -> None:
    pool = BlockPool(8)
    blocks = pool.allocate(3)
    assert pool.num_free == 5 and all(b.ref_cnt == 1 for b in blocks)
    pool.free(blocks)
    assert pool.num_free == 8 and pool.num_referenced() == 0


def test_double_free_is_refused() -> None:
    pool = BlockPool(2)
    (b,) = pool.allocate(1)
    pool.free([b])
    try:
        pool.free([b])
    except RuntimeError:
        pass
    else:
        raise AssertionError("double free went unnoticed")


def test_hash_chain_depends_on_parent() -> None:
    tokens = list(range(16))
    assert hash_block(None, tokens) == hash_block(None, tokens)
    assert hash_block(None, tokens) != hash_block(hash_block(None, [7] * 16), tokens)
    assert hash_block(None, tokens) != hash_block(None, tokens[::-1])


def test_prefix_hit_reuses_full_blocks_only() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=4)
    a = _req("a", list(range(10)))  # 2 full blocks + 2 tokens
    assert kv.allocate_slots(a, 10)
    b = _req("b", list(range(8)) + [99, 98, 97])
    hits, n = kv.get_computed_blocks(b)
    assert n == 8 and [h.block_id for h in hits] == kv.block_ids("a")[:2]
    assert kv.allocate_slots(b, b.num_tokens - n, hits)
    assert kv.block_ids("b")[:2] == kv.block_ids("a")[:2]
    assert all(h.ref_cnt == 2 for h in hits)
    kv.free("a")
    kv.free("b")
    assert kv.pool.num_referenced() == 0
    # Freed blocks stay findable until evicted.
    c = _req("c", list(range(9)))
    hits, n = kv.get_computed_blocks(c)
    assert n == 8
    kv.allocate_slots(c, 1, hits)
    kv.free("c")
    assert kv.pool.num_referenced() == 0


def test_never_hits_on_every_token() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = _req("a", list(range(8)))
    kv.allocate_slots(a, 8)
    same = _req("b", list(range(8)))
    _, n = kv.get_computed_blocks(same)
    assert n == 4  # the last token must still be computed to get logits
    kv.free("a")
    kv.free("b")


def test_failed_allocation_changes_nothing() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=4)
    a = _req("a", list(range(12)))
    assert kv.allocate_slots(a, 12)
    b = _req("b", list(range(100, 108)))
    before = kv.pool.num_free
    assert not kv.can_allocate(b, 8)
    assert not kv.allocate_slots(b, 8)
    assert kv.pool.num_free == before and not kv.holds("b")
    kv.free("a")
    kv.free("b")
    assert kv.pool.num_referenced() == 0


def test_eviction_takes_least_recently_freed() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=2)
    a = _req("a", [1, 2, 3, 4])
    kv.allocate_slots(a, 4)
    kv.free("a")  # both blocks cached and idle
    b = _req("b", [9, 9, 9, 9, 9, 9])
    assert kv.allocate_slots(b, 6)  # needs 3 of 4: evicts a's tail block first
    hits, n = kv.get_computed_blocks(_req("c", [1, 2, 3, 4, 5]))
    assert n == 2  # a's first block survived
    kv.free("b")
    kv.free("c")
    assert kv.pool.num_referenced() == 0


def test_touching_an_idle_hit_counts_against_free_blocks() -> None:
    kv = KVCacheManager(num_blocks=3, block_size=2)
    a = _req("a", [1, 2, 3, 4])
    kv.allocate_slots(a, 4)
    kv.free("a")
    b = _req("b", [1, 2, 3, 4, 5, 6, 7, 8])
    hits, n = kv.get_computed_blocks(b)
    assert n == 4
    # 3 free blocks, 2 of them are b's own hits: 2 more blocks needed, only 1 left.
    assert not kv.can_allocate(b, 4, hits)
    assert kv.can_allocate(b, 2, hits)
    kv.free("b")


def test_bookkeeping_imports_without_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys; import tandem.engine.core.scheduler, tandem.engine.core.kv_cache_manager, "
        "tandem.engine.core.remote_kv, tandem.engine.core.output_processor; "
        "assert 'torch' not in sys.modules, 'tandem.engine.core pulled in torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
