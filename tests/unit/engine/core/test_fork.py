"""Forked requests in the bookkeeping: shared prompt blocks by reference count, copy-on-write
of the last partial block, sequences preempted and freed one by one (pure Python)."""

from __future__ import annotations

import pytest

from tandem.engine.config import SchedulerConfig
from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.request import Request, RequestStatus, fork_seed, sequence_id
from tandem.engine.core.scheduler import Scheduler
from tandem.engine.sampling_params import SamplingParams


def _computed(rid: str, tokens: list[int], kv: KVCacheManager) -> Request:
    """A request whose prompt is in the cache (as after its prefill step)."""
    req = Request(rid, tokens, SamplingParams())
    assert kv.allocate_slots(req, len(tokens))
    req.num_computed_tokens = len(tokens)
    return req


def _fork(parent: Request, kv: KVCacheManager, n: int) -> list[Request]:
    """Sequences 1..n-1 of ``parent``, each holding its blocks, as the engine forks them."""
    out = []
    for j in range(1, n):
        child = Request(sequence_id(parent.request_id, j), parent.prompt_token_ids,
                        parent.params, all_token_ids=list(parent.all_token_ids),
                        num_computed_tokens=parent.num_computed_tokens)
        kv.fork(parent.request_id, child.request_id)
        out.append(child)
    return out


def test_sequence_ids_and_seeds() -> None:
    assert sequence_id("r", 0) == "r" and sequence_id("r", 3) == "r#3"
    assert fork_seed(None, 2) is None and fork_seed(5, 2) == 7
    assert fork_seed(2**63 - 1, 1) == 0  # the router's (seed + j) % 2**63


def test_fork_shares_every_block_and_copies_the_partial_one_on_write() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=4)
    parent = _computed("p", list(range(10)), kv)  # blocks: full, full, partial (2 of 4)
    seqs = [parent] + _fork(parent, kv, 3)
    shared = kv.block_ids("p")
    assert all(kv.block_ids(s.request_id) == shared for s in seqs)
    assert [kv.pool.blocks[b].ref_cnt for b in shared] == [3, 3, 3]
    assert kv.pool.num_referenced() == 3

    for j, s in enumerate(seqs):  # each appends its own first token, then schedules it
        s.append_token(100 + j)
    assert kv.allocate_slots(seqs[0], 1)  # shares the partial block: gets a copy
    assert kv.allocate_slots(seqs[1], 1)  # still shared with sequence 2: a copy too
    assert kv.allocate_slots(seqs[2], 1)  # the last owner writes in place
    tables = [kv.block_ids(s.request_id) for s in seqs]
    assert all(t[:2] == shared[:2] for t in tables)  # full blocks stay shared
    assert tables[2][2] == shared[2]
    assert len({t[2] for t in tables}) == 3
    assert sorted(kv.take_copies()) == sorted([(shared[2], tables[0][2]),
                                               (shared[2], tables[1][2])])
    assert kv.take_copies() == []  # handed out once
    assert [kv.pool.blocks[b].ref_cnt for b in shared] == [3, 3, 1]

    kv.free("p#1")  # one sequence leaves: only its own block goes back
    assert kv.pool.blocks[tables[1][2]].ref_cnt == 0
    assert [kv.pool.blocks[b].ref_cnt for b in shared] == [2, 2, 1]
    kv.free("p")
    kv.free("p#2")
    assert kv.pool.num_referenced() == 0


def test_block_aligned_prompt_needs_no_copy() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=4)
    parent = _computed("p", list(range(8)), kv)
    (child,) = _fork(parent, kv, 2)
    for s in (parent, child):
        s.append_token(7)
        assert kv.allocate_slots(s, 1)  # a new block each: nothing shared is written
    assert kv.take_copies() == []
    assert kv.block_ids("p")[:2] == kv.block_ids("p#1")[:2]
    assert kv.block_ids("p")[2] != kv.block_ids("p#1")[2]
    kv.free("p")
    kv.free("p#1")
    assert kv.pool.num_referenced() == 0


def test_copy_on_write_is_check_then_commit() -> None:
    kv = KVCacheManager(num_blocks=3, block_size=4)
    parent = _computed("p", list(range(10)), kv)  # every block in use
    (child,) = _fork(parent, kv, 2)
    parent.append_token(1)
    before = kv.block_ids("p")
    assert not kv.can_allocate(parent, 1)
    assert not kv.allocate_slots(parent, 1)  # no block for the copy: nothing changes
    assert kv.block_ids("p") == before and kv.take_copies() == []
    assert [kv.pool.blocks[b].ref_cnt for b in before] == [2, 2, 2]
    kv.free("p#1")  # the other sequence leaves: the partial block is the parent's alone
    assert kv.allocate_slots(parent, 1) and kv.take_copies() == []
    kv.free("p")
    assert kv.pool.num_referenced() == 0


def test_a_copy_granted_to_a_request_freed_before_its_step_is_dropped() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=4)
    parent = _computed("p", list(range(6)), kv)
    (child,) = _fork(parent, kv, 2)
    child.append_token(3)
    assert kv.allocate_slots(child, 1)
    kv.free("p#1")  # preempted in the same schedule: its copy must not be made
    assert kv.take_copies() == []
    kv.free("p")
    assert kv.pool.num_referenced() == 0


def test_fork_refuses_a_child_that_holds_blocks() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4)
    _computed("p", [1, 2, 3], kv)
    kv.fork("p", "p#1")
    with pytest.raises(RuntimeError):
        kv.fork("p", "p#1")
    kv.free("p")
    kv.free("p#1")
    assert kv.pool.num_referenced() == 0


def _run_step(sched: Scheduler, kv: KVCacheManager) -> list[str]:
    """One step as the engine takes it, forking a request whose prompt it computed."""
    out = sched.schedule()
    kv.take_copies()
    for s in out.scheduled:
        s.request.num_computed_tokens += s.num_new_tokens
    for s in list(out.scheduled):
        req = s.request
        if req.num_computed_tokens == req.num_tokens:
            if req.num_forks > 1:
                n, req.num_forks = req.num_forks, 1
                for child in _fork(req, kv, n):
                    sched.admit_running(child)
                    child.append_token(9)
            req.append_token(7)
    return out.preempted


def test_scheduler_runs_forked_rows_and_preempts_them_one_by_one() -> None:
    kv = KVCacheManager(num_blocks=7, block_size=4, enable_caching=False)
    sched = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64), kv)
    parent = Request("p", list(range(10)), SamplingParams(), num_forks=3)
    sched.add(parent)
    _run_step(sched, kv)  # prefill (3 blocks) and fork
    assert [r.request_id for r in sched.running] == ["p", "p#1", "p#2"]
    assert kv.pool.num_referenced() == 3
    shared = kv.block_ids("p")[:2]
    preempted: list[str] = []
    for _ in range(4):  # three sequences growing in 7 blocks: the newest gets preempted
        preempted += _run_step(sched, kv)
    assert preempted and all(p != "p" for p in preempted)
    victim = next(r for r in sched.waiting if r.request_id == preempted[0])
    assert victim.status is RequestStatus.PREEMPTED and not kv.holds(victim.request_id)
    for b in shared:  # the victim dropped its references only
        holders = [r for r in sched.running if b in kv.block_ids(r.request_id)]
        assert "p" in [r.request_id for r in holders]
        assert kv.pool.blocks[b].ref_cnt == len(holders)
    for r in list(sched.running) + list(sched.waiting):
        sched.remove(r)
        kv.free(r.request_id)
    assert kv.pool.num_referenced() == 0


def test_admission_counts_a_forked_request_as_its_rows() -> None:
    kv = KVCacheManager(num_blocks=64, block_size=4, enable_caching=False)
    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64), kv)
    sched.add(Request("a", [1, 2, 3], SamplingParams()))
    sched.add(Request("b", [4, 5, 6], SamplingParams(), num_forks=4))
    out = sched.schedule()
    assert [s.request.request_id for s in out.scheduled] == ["a"]  # 1 + 4 rows > 4
    for r in list(sched.running) + list(sched.waiting):
        sched.remove(r)
        kv.free(r.request_id)
    # alone, a request larger than max_num_seqs still goes in (it would never run otherwise)
    sched.add(Request("c", [1, 2], SamplingParams(), num_forks=6))
    assert [s.request.request_id for s in sched.schedule().scheduled] == ["c"]
    sched.remove(sched.running[0])
    kv.free("c")
    assert kv.pool.num_referenced() == 0
