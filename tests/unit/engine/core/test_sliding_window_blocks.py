"""Blocks behind a sliding window go back to the pool while the request runs (pure Python).

Window W = 6, block size 4: once the next token to compute is at position s, keys before
s - 5 are read by nobody, so blocks wholly before s - 5 are freed. Every test ends with the
leak check: nothing referenced once every request is freed.
"""

from __future__ import annotations

import pytest

from tandem.engine.config import SchedulerConfig
from tandem.engine.core.kv_cache_manager import FREED, KVCacheManager
from tandem.engine.core.request import Request
from tandem.engine.core.scheduler import Scheduler
from tandem.engine.sampling_params import SamplingParams

W, BS = 6, 4


def _req(rid: str, tokens: list[int], hold_kv: bool = False) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=100), hold_kv=hold_kv)


def _behind(s: int) -> int:
    """Blocks wholly before the window of a query at position s (what must be freed)."""
    return max(0, s - W + 1) // BS


def _decode(kv: KVCacheManager, req: Request, steps: int) -> None:
    """``steps`` decode steps as the scheduler runs them: one slot each, then the token."""
    for _ in range(steps):
        assert kv.allocate_slots(req, 1)
        req.num_computed_tokens += 1
        req.append_token(7)


def _assert_no_leak(kv: KVCacheManager) -> None:
    assert kv.pool.num_referenced() == 0
    assert kv.pool.num_free == kv.pool.num_blocks


def test_decode_frees_blocks_behind_the_window_and_nothing_else() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS, sliding_window=W)
    req = _req("a", list(range(10)))
    assert kv.allocate_slots(req, 10)  # prefill: positions 0..9, nothing behind position 0
    req.num_computed_tokens = 10
    req.append_token(7)
    assert kv.block_ids("a").count(FREED) == 0 and kv.num_held_blocks("a") == 3
    held_before = list(kv.block_ids("a"))
    for _ in range(30):
        s = req.num_computed_tokens  # the next step's query position
        free_before = kv.pool.num_free
        was_held = kv.num_held_blocks("a")
        _decode(kv, req, 1)
        ids = kv.block_ids("a")
        assert len(ids) == kv.blocks_needed(s + 1)  # the logical list keeps its length
        assert ids[: _behind(s)] == [FREED] * _behind(s)  # everything behind: returned
        assert FREED not in ids[_behind(s):]  # everything the window reads: held
        # blocks handed back plus the one a new block took come from the same pool
        assert kv.pool.num_free == free_before + was_held - kv.num_held_blocks("a")
        assert kv.num_held_blocks("a") <= -(-W // BS) + 1
        assert kv.stranded_blocks(["a"]) == 0
    freed_ids = {b for b in held_before[: _behind(req.num_computed_tokens - 1)]}
    assert all(kv.pool.blocks[b].ref_cnt == 0 for b in freed_ids)
    kv.free("a")
    _assert_no_leak(kv)


def test_without_a_window_nothing_is_freed_early() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    req = _req("a", list(range(10)))
    assert kv.allocate_slots(req, 10)
    req.num_computed_tokens = 10
    req.append_token(7)
    _decode(kv, req, 20)
    assert FREED not in kv.block_ids("a") and kv.num_held_blocks("a") == kv.blocks_needed(30)
    kv.free("a")
    _assert_no_leak(kv)


def test_chunked_prefill_frees_behind_each_chunk() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS, sliding_window=W)
    req = _req("a", list(range(40)))
    for start in range(0, 40, 8):
        assert kv.allocate_slots(req, 8)
        assert kv.block_ids("a")[: _behind(start)] == [FREED] * _behind(start)
        req.num_computed_tokens += 8
    assert kv.num_held_blocks("a") == 10 - _behind(32)
    kv.free("a")
    _assert_no_leak(kv)


def test_a_request_holding_kv_for_a_push_keeps_what_the_push_ships() -> None:
    """The prefill role's chunked prefill frees behind its last chunk's window, but never past
    the blocks the decode side's reservation skips: with a reservation that skips its window's
    leading blocks, those are freed; with one that skips nothing (a decode worker that keeps
    every block: a draft model, or one reporting no skip), nothing is."""
    pushed = KVCacheManager(num_blocks=16, block_size=BS, sliding_window=W).allocate_pushed(
        _req("d", list(range(40))), [])
    assert pushed is not None and pushed == _behind(39) > _behind(32)
    for skip_blocks, freed in ((pushed, _behind(32)), (0, 0), (2, 2)):
        kv = KVCacheManager(num_blocks=16, block_size=BS, sliding_window=W)
        req = _req("p", list(range(40)), hold_kv=True)
        req.push_skip_tokens = skip_blocks * BS
        for _ in range(5):
            assert kv.allocate_slots(req, 8)
            req.num_computed_tokens += 8
        ids = kv.block_ids("p")
        assert ids[:freed] == [FREED] * freed  # last chunk from 32
        assert FREED not in ids[freed:] and FREED not in ids[skip_blocks:]
        kv.free("p")
        _assert_no_leak(kv)


def test_the_freed_blocks_make_room_and_can_allocate_agrees() -> None:
    """A pool too small for the whole sequence serves it: each step's freed block is the one
    the next block takes. can_allocate counts the blocks allocate_slots frees first."""
    kv = KVCacheManager(num_blocks=4, block_size=BS, sliding_window=W)
    req = _req("a", list(range(12)))
    assert kv.allocate_slots(req, 12)  # 3 blocks
    req.num_computed_tokens = 12
    req.append_token(7)
    other = _req("b", [1])
    assert kv.allocate_slots(other, 1)  # the pool is now full
    assert kv.pool.num_free == 0
    for _ in range(40):  # 52 positions: 13 blocks' worth through a pool of 4
        assert kv.can_allocate(req, 1)
        _decode(kv, req, 1)
        assert kv.pool.num_free == 0 or kv.num_held_blocks("a") < 3
    # without a window the same step is refused, and refusing changes nothing
    flat = KVCacheManager(num_blocks=4, block_size=BS)
    r2 = _req("c", list(range(16)))
    assert flat.allocate_slots(r2, 16)
    r2.num_computed_tokens = 16
    r2.append_token(7)
    assert not flat.can_allocate(r2, 1) and not flat.allocate_slots(r2, 1)
    assert flat.num_held_blocks("c") == 4
    for k, rid in ((kv, "a"), (kv, "b"), (flat, "c")):
        k.free(rid)
    _assert_no_leak(kv)
    _assert_no_leak(flat)


def test_a_freed_block_stays_a_prefix_hit_until_the_pool_reuses_it() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=BS, sliding_window=W)
    prompt = list(range(100, 120))  # 5 full blocks
    a = _req("a", prompt)
    assert kv.allocate_slots(a, 20)
    a.num_computed_tokens = 20
    a.append_token(7)
    first_blocks = kv.block_ids("a")[:2]
    _decode(kv, a, 1)  # query at 20: blocks 0..2 are behind (keys 15.. are read)
    assert kv.block_ids("a")[:3] == [FREED] * 3
    # a new request with the same prompt finds the freed, still cached blocks: their KV is
    # exact, and the ones behind its own window are not even taken
    b = _req("b", prompt + [1, 2, 3])
    hits, n = kv.get_computed_blocks(b)
    assert n == 20 and [h.block_id for h in hits[:2]] == first_blocks
    assert kv.allocate_slots(b, b.num_tokens - n, hits)
    ids = kv.block_ids("b")
    assert ids[: _behind(20)] == [FREED] * _behind(20)
    assert ids[_behind(20) : 5] == [h.block_id for h in hits[_behind(20) :]]
    assert all(kv.pool.blocks[i].ref_cnt == 0 for i in first_blocks)  # not referenced
    kv.free("b")
    # the pool hands the freed blocks out again (least recently freed first): their hashes
    # go with them, so a later request's lookup stops before them instead of reading them
    assert kv.pool.num_free == 5  # "a" holds 3
    c = _req("c", list(range(500, 520)))
    assert kv.allocate_slots(c, 20)  # 5 blocks: every free one, the old prefix's too
    d = _req("d", prompt + [9])
    hits, n = kv.get_computed_blocks(d)
    assert n == 0 and hits == []
    for rid in ("a", "c"):
        kv.free(rid)
    _assert_no_leak(kv)


def test_forked_sequences_return_a_shared_block_once_both_passed_it() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS, sliding_window=W)
    parent = _req("p", list(range(12)))
    assert kv.allocate_slots(parent, 12)
    parent.num_computed_tokens = 12
    parent.append_token(7)
    kv.fork("p", "p#1")
    child = Request("p#1", parent.prompt_token_ids, parent.params,
                    all_token_ids=list(parent.all_token_ids), num_computed_tokens=12)
    shared = kv.block_ids("p")[0]
    _decode(kv, parent, 4)  # the parent passed block 0: its reference is dropped
    assert kv.block_ids("p")[0] == FREED and kv.pool.blocks[shared].ref_cnt == 1
    _decode(kv, child, 4)
    assert kv.block_ids("p#1")[0] == FREED and kv.pool.blocks[shared].ref_cnt == 0
    for rid in ("p", "p#1"):
        kv.free(rid)
    kv.take_copies()
    _assert_no_leak(kv)


def test_speculative_rollback_keeps_the_window() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS, sliding_window=W)
    req = _req("a", list(range(20)))
    assert kv.allocate_slots(req, 20)
    req.num_computed_tokens = 20
    req.append_token(7)
    assert kv.allocate_slots(req, 1 + 6)  # one token and six draft slots
    kv.trim("a", 21)  # every draft rejected
    ids = kv.block_ids("a")
    assert len(ids) == kv.blocks_needed(21) and FREED not in ids[_behind(20):]
    kv.free("a")
    _assert_no_leak(kv)


@pytest.mark.parametrize("chunk", [8, 64])
def test_scheduler_runs_long_sequences_through_a_small_pool(chunk: int) -> None:
    """Two requests decode far past what the pool could hold without freeing; preemption
    and re-admission keep the books; everything comes back at the end."""
    kv = KVCacheManager(num_blocks=12, block_size=BS, sliding_window=W)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=chunk, max_num_seqs=4), kv)
    reqs = [_req(f"r{i}", list(range(i, i + 30))) for i in range(2)]
    for r in reqs:
        sched.add(r)
    for _ in range(400):
        out = sched.schedule()
        for s in out.scheduled:
            s.request.num_computed_tokens += s.num_new_tokens
            if s.samples:
                s.request.append_token(5)
        for r in list(sched.running):
            if r.num_output_tokens >= 60:  # 90 positions: 23 blocks each without freeing
                sched.remove(r)
                kv.free(r.request_id)
        live = [r.request_id for r in sched.running]
        assert kv.stranded_blocks(live) == 0
        if not sched.num_unfinished():
            break
    assert not sched.num_unfinished()
    assert all(r.num_output_tokens == 60 for r in reqs)
    _assert_no_leak(kv)


def test_a_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="sliding_window"):
        KVCacheManager(num_blocks=4, block_size=BS, sliding_window=0)


@pytest.mark.parametrize("n", [1, 5, 6, 8, 13, 23, 24])
def test_a_pushed_prompt_gets_only_its_first_decoded_tokens_window(n: int) -> None:
    """The decode role's reservation of an n-token prompt: the blocks before the window of
    position n (the first decoded token) are never held, the rest are, and at least the block
    holding the last prompt token is filled; what the push skips is exactly those."""
    kv = KVCacheManager(num_blocks=16, block_size=BS, sliding_window=W)
    req = _req("a", list(range(n)))
    skip = kv.allocate_pushed(req, [])
    total = kv.blocks_needed(n)
    assert skip == min(_behind(n), total - 1)
    ids = kv.block_ids("a")
    assert len(ids) == total and ids[:skip] == [FREED] * skip and FREED not in ids[skip:]
    assert kv.pool.num_free == 16 - (total - skip)
    # the first decode step frees nothing more: the window it reads is all there
    req.num_computed_tokens = n
    req.append_token(7)
    assert kv.allocate_slots(req, 1) and kv.block_ids("a")[:skip] == [FREED] * skip
    assert FREED not in kv.block_ids("a")[_behind(n):]
    kv.free("a")
    _assert_no_leak(kv)


def test_a_pushed_prompt_is_refused_whole_when_the_window_does_not_fit() -> None:
    kv = KVCacheManager(num_blocks=2, block_size=BS, sliding_window=W)
    assert kv.allocate_pushed(_req("a", list(range(40))), []) == 8  # keys 35..40: blocks 8, 9
    assert kv.allocate_pushed(_req("b", list(range(40))), []) is None
    assert not kv.holds("b") and kv.pool.num_free == 0
    kv.free("a")
    _assert_no_leak(kv)
