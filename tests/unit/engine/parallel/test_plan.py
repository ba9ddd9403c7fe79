"""The tensor-parallel split (tandem/engine/parallel/plan.py), over every small shape."""

from __future__ import annotations

import itertools

import pytest

from tandem.engine.parallel.plan import Span, TensorParallelError, expert_span, plan_shards


def _shapes():
    for nkv, group_size, world in itertools.product((1, 2, 3, 4, 6, 8), (1, 2, 3), range(1, 9)):
        nh = nkv * group_size
        if nh % world == 0 and (nkv % world == 0 or world % nkv == 0):
            yield nh, nkv, world


@pytest.mark.parametrize(("nh", "nkv", "world"), list(_shapes()))
def test_every_head_and_row_is_owned_as_the_split_says(nh: int, nkv: int, world: int) -> None:
    hd, inter = 4, 6 * world
    plan = plan_shards(world, num_heads=nh, num_kv_heads=nkv, head_dim=hd,
                       intermediate_size=inter)
    shards = [plan.rank(r) for r in range(world)]
    # q heads, o_proj columns, the MLP's columns: each exactly once across the group
    assert sorted(h for s in shards for h in range(s.q_heads.start, s.q_heads.stop)) == \
        list(range(nh))
    assert sorted(c for s in shards for c in range(s.o_cols().start, s.o_cols().stop)) == \
        list(range(nh * hd))
    assert sorted(i for s in shards for i in range(s.down_cols().start, s.down_cols().stop)) \
        == list(range(inter))
    # KV heads: each held by world/nkv ranks when replicated, by exactly one when split
    held = [h for s in shards for h in range(s.kv_heads.start, s.kv_heads.stop)]
    replicas = max(1, world // nkv)
    assert sorted(held) == sorted(list(range(nkv)) * replicas)
    assert all(s.kv_replicas == replicas for s in shards)
    assert plan.kv_head_ranges() == [s.kv_heads for s in shards]
    for s in shards:
        # every q head a rank owns attends over a KV head the same rank owns (GQA groups)
        for h in range(s.q_heads.start, s.q_heads.stop):
            assert s.kv_heads.start <= h // (nh // nkv) < s.kv_heads.stop
        q, k, v = s.qkv_rows()
        assert q == Span(s.q_heads.start * hd, s.q_heads.stop * hd)
        assert k.start == nh * hd + s.kv_heads.start * hd and k.size == s.kv_heads.size * hd
        assert v.start == (nh + nkv) * hd + s.kv_heads.start * hd and v.size == k.size
        gate, up = s.gate_up_rows()
        assert up.start - gate.start == inter and gate.size == up.size == inter // world
        # an expert's (or shared expert's) own width splits the same way
        egate, eup = s.gate_up_rows(2 * world)
        assert (egate, eup) == (Span(2 * s.rank, 2 * s.rank + 2),
                                Span(2 * world + 2 * s.rank, 2 * world + 2 * s.rank + 2))
        assert s.down_cols(2 * world) == egate == s.split(2 * world)
        assert s.adds_bias == (s.rank == 0)


def test_smollm2_over_three_ranks_holds_one_kv_head_each() -> None:
    plan = plan_shards(3, num_heads=9, num_kv_heads=3, head_dim=64, intermediate_size=1536,
                       group=32)
    assert [(s.start, s.stop) for s in plan.kv_head_ranges()] == [(0, 1), (1, 2), (2, 3)]
    assert plan.rank(2).q_heads == Span(6, 9)
    assert plan.rank(1).o_cols() == Span(192, 384)  # 6 blocks of 32: on block boundaries


def test_fewer_kv_heads_than_ranks_replicates_them() -> None:
    plan = plan_shards(4, num_heads=8, num_kv_heads=2, head_dim=8, intermediate_size=16)
    assert [s.start for s in plan.kv_head_ranges()] == [0, 0, 1, 1]


@pytest.mark.parametrize(("kwargs", "names"), [
    (dict(world=2, num_heads=9, num_kv_heads=3), ["9 attention heads", "2"]),
    (dict(world=4, num_heads=12, num_kv_heads=3), ["3 KV heads", "4"]),
    (dict(world=3, num_heads=6, num_kv_heads=6, intermediate_size=64), ["64", "3"]),
    (dict(world=2, num_heads=4, num_kv_heads=2, head_dim=8, group=32), ["16 columns", "32"]),
    (dict(world=2, num_heads=4, num_kv_heads=2, head_dim=32, intermediate_size=96, group=32),
     ["48 columns", "32"]),
    (dict(world=0), [">= 1", "0"]),
    (dict(world=2, expert_intermediate_size=33), ["an expert's intermediate size 33", "2"]),
    (dict(world=3, num_heads=6, num_kv_heads=3, intermediate_size=96, shared_intermediate_size=64),
     ["the shared expert's intermediate size 64", "3"]),
    (dict(world=2, num_heads=4, num_kv_heads=2, head_dim=32, intermediate_size=128,
          expert_intermediate_size=64, shared_intermediate_size=96, group=32),
     ["shared expert", "48 columns", "32"]),
    (dict(world=3, num_heads=6, num_kv_heads=3, intermediate_size=96,
          expert_intermediate_size=33, shared_intermediate_size=64, num_experts=8,
          expert_parallel=True), ["the shared expert's intermediate size 64", "3"]),
    (dict(world=3, mla=True), ["4 attention heads", "3"]),
    (dict(world=2, head_dim=12, group=32, mla=True), ["24 columns", "32"]),
])
def test_sizes_that_do_not_divide_are_refused_naming_the_numbers(kwargs, names) -> None:
    args = dict(num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=96)
    args.update(kwargs)
    world = args.pop("world")
    with pytest.raises(TensorParallelError) as err:
        plan_shards(world, **args)
    for name in names:
        assert name in str(err.value)


def test_a_single_rank_owns_everything_and_checks_nothing() -> None:
    s = plan_shards(1, num_heads=9, num_kv_heads=3, head_dim=64, intermediate_size=1536,
                    expert_intermediate_size=7).rank(0)
    assert s.q_heads == Span(0, 9) and s.kv_heads == Span(0, 3)
    assert s.intermediate == Span(0, 1536)
    with pytest.raises(TensorParallelError, match="rank 1"):
        plan_shards(1, num_heads=9, num_kv_heads=3, head_dim=64,
                    intermediate_size=1536).rank(1)


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_latent_attention_splits_its_heads_and_replicates_the_latent(world: int) -> None:
    """MLA: 8 query heads split; the latent cache is one head every rank holds whole (the
    config's KV heads, equal to the query heads, play no part); o_proj's input per head is
    ``head_dim`` (v_head_dim)."""
    plan = plan_shards(world, num_heads=8, num_kv_heads=8, head_dim=12, intermediate_size=64,
                       expert_intermediate_size=32, shared_intermediate_size=64, mla=True)
    shards = [plan.rank(r) for r in range(world)]
    assert [s.q_heads for s in shards] == [Span(r * 8 // world, (r + 1) * 8 // world)
                                          for r in range(world)]
    assert plan.kv_head_ranges() == [Span(0, 1)] * world
    assert all(s.kv_replicas == world for s in shards)
    assert sorted(c for s in shards for c in range(s.o_cols().start, s.o_cols().stop)) == \
        list(range(8 * 12))


@pytest.mark.parametrize(("experts", "world"), list(itertools.product(range(1, 21), range(1, 10))))
def test_expert_parallel_places_every_expert_on_exactly_one_rank(experts: int,
                                                                 world: int) -> None:
    """vLLM's linear placement: contiguous ranges in rank order covering every expert once,
    sizes E // N, one more on each of the first E % N ranks (empty past the experts)."""
    spans = [expert_span(experts, world, r) for r in range(world)]
    assert spans[0].start == 0 and spans[-1].stop == experts
    assert all(a.stop == b.start for a, b in itertools.pairwise(spans))
    assert [s.size for s in spans] == [experts // world + (r < experts % world)
                                       for r in range(world)]


def test_expert_parallel_holds_whole_experts_of_any_width() -> None:
    """8 experts over 3 ranks: [0, 3), [3, 6), [6, 8); an expert width of 34 splits nowhere
    (no expert is cut), while the shared expert's 96 still splits; without the flag the
    same width is refused, and a dense model (no experts) places nothing."""
    shape = dict(num_heads=6, num_kv_heads=3, head_dim=16, intermediate_size=96,
                 expert_intermediate_size=34, shared_intermediate_size=96)
    plan = plan_shards(3, **shape, num_experts=8, expert_parallel=True)
    assert [plan.rank(r).experts for r in range(3)] == [Span(0, 3), Span(3, 6), Span(6, 8)]
    assert plan.rank(2).split(96) == Span(64, 96)
    with pytest.raises(TensorParallelError, match="an expert's intermediate size 34"):
        plan_shards(3, **shape, num_experts=8)
    sliced = plan_shards(3, **{**shape, "expert_intermediate_size": 36}, num_experts=8)
    assert sliced.rank(0).experts is None  # every expert, split over its width
    dense = plan_shards(2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=96,
                        expert_parallel=True)
    assert not dense.expert_parallel and dense.rank(1).experts is None
