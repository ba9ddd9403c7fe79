"""The remote-KV ledger (pure Python): every transition, double ends, unknown ids, no leaks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.remote_kv import RemoteKV, RemoteState
from tandem.engine.core.request import Request, RequestStatus
from tandem.engine.errors import InvalidRequestError, OutOfBlocksError, UnknownRequestError
from tandem.engine.sampling_params import SamplingParams

BS = 4


def _req(rid: str, n: int = 10, prior: int = 0) -> Request:
    tokens = list(range(1, n + 1))
    return Request(rid, tokens[: n - prior], SamplingParams(), all_token_ids=tokens)


@pytest.fixture
def ledger() -> Iterator[RemoteKV]:
    """A ledger over 8 blocks of 4 tokens; after each test every block is back in the pool."""
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    remote = RemoteKV(kv)
    yield remote
    assert len(remote) == 0 and remote.num_reserved == remote.num_held == 0
    assert kv.pool.num_referenced() == 0 and kv.pool.num_free == kv.pool.num_blocks


def test_reserve_then_commit_hands_the_blocks_to_the_request(ledger: RemoteKV) -> None:
    req = _req("r", 10)
    ids = ledger.reserve(req, "t").fill_block_ids
    assert len(ids) == 3 and ledger.kv.pool.num_free == 5
    assert req.status is RequestStatus.WAITING_FOR_REMOTE_KV and req.num_cached_tokens == 0
    entry = ledger.get("r")
    assert entry is not None and entry.state is RemoteState.RESERVED
    assert (entry.request_id, entry.transfer_id, entry.block_ids) == ("r", "t", ids)
    assert ledger.reserved("t") is entry and ledger.num_reserved == 1
    assert ledger.commit("t") is req
    assert req.num_computed_tokens == 10 and "r" not in ledger
    assert ledger.kv.block_ids("r") == ids  # still allocated: the request runs on them
    assert ledger.commit("t") is None and ledger.end("t") is None  # ended once only
    ledger.kv.free("r")  # what the engine does when the request finishes


def test_commit_indexes_full_blocks_for_prefix_reuse(ledger: RemoteKV) -> None:
    req = _req("r", 9)
    ledger.reserve(req, "t")
    ledger.commit("t")
    other = _req("o", 9)
    _, hit = ledger.kv.get_computed_blocks(other)
    assert hit == 8  # two full blocks of four; the partial third is never indexed
    ledger.kv.free("r")


def test_end_frees_and_marks_aborted(ledger: RemoteKV) -> None:
    req = _req("r")
    ledger.reserve(req, "t")
    assert ledger.end("t") is req
    assert req.status is RequestStatus.FINISHED_ABORTED and ledger.kv.pool.num_free == 8
    assert ledger.end("t") is None and ledger.commit("t") is None
    with pytest.raises(UnknownRequestError):
        ledger.unreserve("r")


def test_unreserve_gives_back_a_request_to_prefill(ledger: RemoteKV) -> None:
    req = _req("r", 10, prior=3)
    ledger.reserve(req, "t")
    back = ledger.unreserve("r")
    assert back is req and req.num_computed_tokens == 0 and req.num_cached_tokens == -1
    assert req.num_output_tokens == 3  # the prior tokens stay output
    assert not ledger.kv.holds("r") and ledger.reserved("t") is None
    assert ledger.commit("t") is None and ledger.end("t") is None
    with pytest.raises(UnknownRequestError):
        ledger.unreserve("r")


def test_refused_reservations_change_nothing(ledger: RemoteKV) -> None:
    ledger.reserve(_req("a", 20), "ta")  # 5 of 8 blocks
    with pytest.raises(OutOfBlocksError, match="free"):
        ledger.reserve(_req("b", 20), "tb")
    assert not ledger.kv.holds("b") and ledger.kv.pool.num_free == 3
    with pytest.raises(InvalidRequestError) as err:
        ledger.reserve(_req("a", 2), "other")
    assert err.value.field == "request_id"
    with pytest.raises(InvalidRequestError) as err:
        ledger.reserve(_req("c", 2), "ta")
    assert err.value.field == "transfer_id"
    with pytest.raises(InvalidRequestError):
        ledger.reserve(_req("c", 2), "")
    assert len(ledger) == 1 and ledger.kv.pool.num_free == 3
    ledger.end("ta")


def test_hold_then_release(ledger: RemoteKV) -> None:
    req = _req("p", 10)
    ledger.kv.allocate_slots(req, 10)  # a finished prefill's blocks
    ids = ledger.kv.block_ids("p")
    req.status = RequestStatus.FINISHED_LENGTH
    ledger.hold(req)
    assert ledger.held_block_ids("p") == ids and ledger.num_held == 1
    assert ledger.num_reserved == 0
    entry = ledger.get("p")
    assert entry is not None and entry.state is RemoteState.HELD and entry.transfer_id is None
    with pytest.raises(InvalidRequestError):
        ledger.hold(req)
    with pytest.raises(UnknownRequestError):
        ledger.unreserve("p")  # held, not reserved
    assert ledger.release("p") is True
    assert ledger.release("p") is False  # idempotent
    with pytest.raises(UnknownRequestError):
        ledger.held_block_ids("p")
    _, hit = ledger.kv.get_computed_blocks(_req("q", 10))
    assert hit == 8  # released blocks stay prefix-cached


def test_unknown_ids(ledger: RemoteKV) -> None:
    assert ledger.get("x") is None and ledger.reserved("x") is None
    assert ledger.commit("x") is None and ledger.end("x") is None
    assert ledger.release("x") is False and "x" not in ledger
    with pytest.raises(UnknownRequestError):
        ledger.unreserve("x")
    with pytest.raises(UnknownRequestError):
        ledger.held_block_ids("x")


def test_reserved_ids_are_not_held(ledger: RemoteKV) -> None:
    ledger.reserve(_req("r"), "t")
    with pytest.raises(UnknownRequestError):
        ledger.held_block_ids("r")
    assert ledger.release("r") is False  # a reservation is ended, never released
    assert ledger.num_reserved == 1
    ledger.end("t")


def test_many_reservations_every_end_leaks_nothing(ledger: RemoteKV) -> None:
    """Reserve until full, end them every way in a mixed order; the fixture checks the pool."""
    reqs = [_req(f"r{i}", 6) for i in range(4)]  # 2 blocks each: the whole pool
    for i, r in enumerate(reqs):
        ledger.reserve(r, f"t{i}")
    assert ledger.kv.pool.num_free == 0 and ledger.num_reserved == 4
    assert ledger.commit("t0") is reqs[0]
    assert ledger.end("t1") is reqs[1]
    assert ledger.unreserve("r2") is reqs[2]
    assert ledger.end("t3") is reqs[3]
    for tid in ("t0", "t1", "t2", "t3"):
        assert ledger.commit(tid) is None and ledger.end(tid) is None
    ledger.kv.free("r0")


def test_reserve_reuses_the_cached_prefix_and_leases_only_the_rest(ledger: RemoteKV) -> None:
    """A second turn extending a committed prompt takes its cached blocks (referenced, never
    to be written) and gets fresh blocks for the rest only; every end frees both kinds."""
    first = _req("r", 9)
    ledger.reserve(first, "t")
    ledger.commit("t")
    ledger.kv.free("r")  # finished: its two full blocks stay cached
    turn2 = _req("r2", 14)  # same first 9 tokens, then more
    got = ledger.reserve(turn2, "t2")
    assert got.cached_tokens == 8 and turn2.num_cached_tokens == 8
    entry = ledger.get("r2")
    assert entry is not None and len(entry.block_ids) == 4
    assert got.fill_block_ids == entry.block_ids[2:]  # blocks 3 and 4 only
    assert ledger.kv.pool.num_free == 4  # 8 - 4 held (2 reused + 2 fresh)
    # Pinned from Reserve on: a flood of other requests cannot evict the reused blocks.
    flood = Request("flood", list(range(100, 116)), SamplingParams())
    assert ledger.kv.allocate_slots(flood, 16, cache_tokens=False)
    assert ledger.kv.pool.num_free == 0
    assert ledger.kv.get_computed_blocks(_req("probe", 14))[1] == 8
    ledger.kv.free("flood")
    ledger.kv.free("probe")
    assert ledger.commit("t2") is turn2 and turn2.num_computed_tokens == 14
    ledger.kv.free("r2")
    ended = _req("r3", 14)
    assert ledger.reserve(ended, "t3").cached_tokens == 12  # now three full blocks
    assert ledger.end("t3") is ended


def test_a_full_prompt_hit_still_leaves_its_last_block_to_fill(ledger: RemoteKV) -> None:
    """The prefill worker always pushes the block with the last prompt token (it computes the
    first output token from it), so a cached prompt of whole blocks is not reused entirely."""
    ledger.reserve(_req("r", 8), "t")
    ledger.commit("t")
    ledger.kv.free("r")
    again = _req("again", 8)
    got = ledger.reserve(again, "t2")
    assert got.cached_tokens == 4 and len(got.fill_block_ids) == 1
    assert ledger.unreserve("again") is again


def test_an_evicted_prefix_is_reserved_afresh(ledger: RemoteKV) -> None:
    """The router believed the prefix was here, but other requests evicted it before Reserve:
    nothing is reused and every block is leased to the push."""
    ledger.reserve(_req("r", 9), "t")
    ledger.commit("t")
    ledger.kv.free("r")
    filler = Request("fill", list(range(100, 132)), SamplingParams())  # every block
    assert ledger.kv.allocate_slots(filler, 32, cache_tokens=False)
    ledger.kv.free("fill")
    turn2 = _req("r2", 14)
    got = ledger.reserve(turn2, "t2")
    assert got.cached_tokens == 0 and len(got.fill_block_ids) == 4
    assert ledger.end("t2") is turn2


def test_stranded_blocks_counts_what_no_live_request_holds(ledger: RemoteKV) -> None:
    """The leak gauge: blocks in use that none of the live requests (scheduled, reserved,
    held) holds. A request the engine forgot without ``free`` strands its blocks."""
    kv = ledger.kv
    ledger.reserve(_req("r", 10), "t")  # 3 blocks, reserved
    forgotten = _req("f", 6)
    assert kv.allocate_slots(forgotten, 6)  # 2 blocks whose owner the engine no longer knows
    assert kv.stranded_blocks(ledger.request_ids()) == 2
    assert kv.stranded_blocks([*ledger.request_ids(), "f"]) == 0
    assert kv.stranded_blocks([]) == 5
    kv.free("f")
    assert kv.stranded_blocks(ledger.request_ids()) == 0
    ledger.end("t")
    assert kv.stranded_blocks([]) == 0


def test_a_precopy_is_held_prefix_cached_then_found_by_the_move(ledger: RemoteKV) -> None:
    """A pre-copy's commit holds its blocks, indexed for prefix reuse, and runs nothing; the
    move's reservation finds them (only its tail to fill) under eviction pressure, since
    they are held; released, the move's request keeps them."""
    pre = _req("pre", 8)  # two full blocks
    ledger.reserve(pre, "tp", precopy=True)
    assert ledger.reserved("tp") is not None and ledger.reserved("tp").precopy
    assert ledger.hold_pushed("tp") is pre and ledger.hold_pushed("tp") is None
    entry = ledger.get("pre")
    assert entry is not None and entry.state is RemoteState.HELD and ledger.num_held == 1
    filler = _req("filler", 16)  # fills every free block: an idle cached block would go
    filler.all_token_ids = [t + 100 for t in filler.all_token_ids]
    filler.prompt_token_ids = list(filler.all_token_ids)
    ledger.reserve(filler, "tf")
    assert ledger.kv.pool.num_free == 2
    move = _req("move", 11)  # the pre-copied 8 tokens and 3 more
    got = ledger.reserve(move, "tm")
    assert got.cached_tokens == 8 and len(got.fill_block_ids) == 1
    assert ledger.release("pre")  # the move's reservation still references its blocks
    assert ledger.kv.block_ids("move")[:2] == entry.block_ids
    for tid in ("tf", "tm"):
        assert ledger.end(tid) is not None


def test_a_pin_references_leading_blocks_until_freed() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    req = _req("r", 10)
    kv.allocate_slots(req, 10)
    ids = kv.pin("#pin", "r", 2)
    assert ids == kv.block_ids("r")[:2]
    with pytest.raises(RuntimeError):
        kv.pin("#pin", "r", 1)  # one pin per id
    with pytest.raises(RuntimeError):
        kv.pin("#other", "r", 4)  # more blocks than the request holds
    kv.free("r")
    assert kv.pool.num_free == kv.pool.num_blocks - 2  # the pin keeps the two
    assert kv.stranded_blocks(["#pin"]) == 0 and kv.stranded_blocks([]) == 2
    kv.free("#pin")
    assert kv.pool.num_free == kv.pool.num_blocks and kv.pool.num_referenced() == 0


@pytest.mark.parametrize("options", [{"enable_caching": False}, {"sliding_window": 6}],
                         ids=["no-prefix-cache", "sliding-window"])
def test_a_precopy_is_refused_where_a_move_could_not_find_it(options: dict) -> None:
    """Without a prefix cache, or with blocks freed behind a window, the move's Reserve would
    not find a pre-copy: refused before anything is allocated (a plain Reserve still works)."""
    kv = KVCacheManager(num_blocks=8, block_size=BS, **options)
    ledger = RemoteKV(kv)
    with pytest.raises(InvalidRequestError, match="pre-copy"):
        ledger.reserve(_req("pre", 8), "tp", precopy=True)
    assert kv.pool.num_free == 8 and ledger.reserved("tp") is None
    ledger.reserve(_req("plain", 8), "t")
    assert ledger.end("t") is not None and kv.pool.num_free == 8
