"""Scheduler: token budget, chunked prefill, preemption, admission (pure Python)."""

from __future__ import annotations

from tandem.engine.config import SchedulerConfig
from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.request import Request, RequestStatus
from tandem.engine.core.scheduler import Scheduler
from tandem.engine.sampling_params import SamplingParams


def _setup(num_blocks: int = 64, budget: int = 32, seqs: int = 8, bs: int = 4):
    kv = KVCacheManager(num_blocks, bs, enable_caching=False)
    return kv, Scheduler(SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=budget), kv)


def _run_step(sched: Scheduler, sample_token: int = 7):
    """What the engine does after the forward: advance progress, append sampled tokens."""
    out = sched.schedule()
    for s in out.scheduled:
        s.request.num_computed_tokens += s.num_new_tokens
    for s in out.scheduled:
        if s.request.num_computed_tokens == s.request.num_tokens:
            s.request.append_token(sample_token)
    return out


def test_chunked_prefill_respects_budget() -> None:
    kv, sched = _setup(budget=10)
    req = Request("a", list(range(25)), SamplingParams())
    sched.add(req)
    chunks = []
    while req.num_output_tokens == 0:
        out = _run_step(sched)
        chunks.append(out.num_tokens)
        assert out.num_tokens <= 10
    assert chunks == [10, 10, 5]
    sched.remove(req)
    kv.free("a")


def test_decodes_and_new_prefill_share_a_step() -> None:
    kv, sched = _setup(budget=16)
    a = Request("a", list(range(8)), SamplingParams())
    sched.add(a)
    _run_step(sched)
    b = Request("b", list(range(30)), SamplingParams())
    sched.add(b)
    out = _run_step(sched)
    assert [(s.request.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 1), ("b", 15)]
    for r in (a, b):
        sched.remove(r)
        kv.free(r.request_id)


def test_preemption_frees_newest_and_recomputes_it() -> None:
    kv, sched = _setup(num_blocks=4, budget=64, bs=4)
    a = Request("a", list(range(7)), SamplingParams())  # 2 blocks
    b = Request("b", list(range(7)), SamplingParams())  # 2 blocks
    sched.add(a)
    sched.add(b)
    _run_step(sched)
    assert kv.pool.num_free == 0
    # a needs a third block at its 9th token: b is preempted to make room.
    _run_step(sched)  # token 8 of a and b fits in their 2nd block
    out = _run_step(sched)
    assert out.preempted == ["b"]
    assert b.status is RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert sched.waiting[0] is b
    for r in (a, b):
        sched.remove(r)
        kv.free(r.request_id)
    assert kv.pool.num_referenced() == 0


def test_max_num_seqs_bounds_running() -> None:
    kv, sched = _setup(seqs=2)
    reqs = [Request(str(i), [1, 2, 3], SamplingParams()) for i in range(4)]
    for r in reqs:
        sched.add(r)
    out = _run_step(sched)
    assert len(out.scheduled) == 2 and len(sched.waiting) == 2
    for r in reqs:
        sched.remove(r)
        kv.free(r.request_id)


def test_request_larger_than_pool_is_unschedulable() -> None:
    kv, sched = _setup(num_blocks=2, bs=4)
    big = Request("big", list(range(12)), SamplingParams())
    sched.add(big)
    out = sched.schedule()
    assert out.unschedulable == [big] and not out.scheduled
    assert kv.pool.num_referenced() == 0
