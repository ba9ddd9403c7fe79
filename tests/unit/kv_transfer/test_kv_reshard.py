"""Re-sharding a prompt's KV between tensor-parallel groups of different sizes
(tandem/kv_transfer/reshard.py): over every group pair the engine's split allows, applying the
routes to per-rank caches cut from one whole cache gives each decode rank exactly its own
heads, and every head crosses the wire once per decode rank holding it."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from tandem.engine.parallel.plan import plan_shards
from tandem.kv_transfer import KvLayout, LayoutMismatchError
from tandem.kv_transfer.errors import MalformedFrame
from tandem.kv_transfer.reshard import (
    GroupKv,
    ReshardError,
    check_reshardable,
    committer,
    parts_into,
    pushed_heads,
    routes,
)

BASE = KvLayout(model_id="m", dtype="float32", kv_dtype="float32", block_size=4, num_layers=2,
                num_kv_heads=1, head_dim=8)


def _group(nkv: int, world: int) -> GroupKv:
    """The group the engine's plan makes of ``nkv`` KV heads over ``world`` ranks."""
    plan = plan_shards(world, num_heads=nkv * world, num_kv_heads=nkv, head_dim=8,
                       intermediate_size=world)
    ranges = tuple((s.start, s.stop) for s in plan.kv_head_ranges())
    layout = replace(BASE, num_kv_heads=ranges[0][1] - ranges[0][0],
                     tensor_parallel_size=world if world > 1 else 0)
    return GroupKv(layout, ranges)


def _pairs():
    for nkv in (1, 2, 3, 4, 6):
        sizes = [w for w in range(1, 9) if nkv % w == 0 or w % nkv == 0]
        for a, b in itertools.product(sizes, sizes):
            yield nkv, a, b


@pytest.mark.parametrize(("nkv", "a", "b"), list(_pairs()))
def test_routes_then_copies_give_every_decode_rank_its_heads(nkv: int, a: int, b: int) -> None:
    src, dst = _group(nkv, a), _group(nkv, b)
    whole = np.random.default_rng(nkv * 100 + a * 10 + b).standard_normal((3, nkv, 8))
    src_caches = [whole[:, s:e].copy() for s, e in src.head_ranges]
    dst_caches = [np.full((3, e - s, 8), np.nan) for s, e in dst.head_ranges]
    sent = 0
    for r in routes(src, dst):
        piece = src_caches[r.src][:, r.src_offset:r.src_offset + r.heads]
        dst_caches[r.dst][:, r.dst_offset:r.dst_offset + r.heads] = piece
        sent += r.heads
    for (s, e), got in zip(dst.head_ranges, dst_caches, strict=True):
        np.testing.assert_array_equal(got, whole[:, s:e])
    # every head crosses the wire once per decode rank holding it: with split decode heads,
    # a re-sharded push is the single-rank push's bytes
    replicas = max(1, b // nkv)
    assert sent == pushed_heads(src, dst) == nkv * replicas
    assert sorted(h for r in routes(src, dst) for h in range(r.start, r.stop)) == \
        sorted(list(range(nkv)) * replicas)
    every = routes(src, dst)
    for d in range(b):
        assert parts_into(every, d) == len({r.src for r in every if r.dst == d})
        assert committer(every, d) == min(r.src for r in every if r.dst == d)
    assert committer(every, 0) == 0  # decode rank 0's COMMIT comes from prefill rank 0


def test_the_issue_s_three_handoffs_route_as_documented() -> None:
    one, three = _group(3, 1), _group(3, 3)
    assert [(r.src, r.dst, r.start, r.stop) for r in routes(one, three)] == \
        [(0, 0, 0, 1), (0, 1, 1, 2), (0, 2, 2, 3)]
    assert [(r.src, r.dst, r.start, r.stop) for r in routes(three, one)] == \
        [(0, 0, 0, 1), (1, 0, 1, 2), (2, 0, 2, 3)]
    two_of_2 = _group(2, 2)
    assert [(r.src, r.dst, r.dst_offset) for r in routes(two_of_2, _group(2, 1))] == \
        [(0, 0, 0), (1, 0, 1)]
    # one KV head over four ranks: rank 0 sends it (never its replicas on ranks 1..3), to
    # each decode rank that holds it
    assert [(r.src, r.dst) for r in routes(_group(1, 4), _group(1, 2))] == [(0, 0), (0, 1)]
    assert [(r.src, r.dst) for r in routes(_group(1, 4), _group(1, 1))] == [(0, 0)]


@pytest.mark.parametrize(("field", "value"), [
    ("model_id", "other"), ("kv_dtype", "float16"), ("block_size", 8), ("num_layers", 3),
    ("head_dim", 16)])
def test_a_group_that_differs_beyond_its_split_is_refused_by_name(field: str, value: object
                                                                  ) -> None:
    src = _group(2, 2)
    other = GroupKv(replace(src.layout, **{field: value}), src.head_ranges)
    with pytest.raises(ReshardError, match=field) as err:
        routes(src, other)
    assert isinstance(err.value, LayoutMismatchError)  # refused as any mismatched HELLO


def test_different_kv_head_counts_are_refused() -> None:
    with pytest.raises(ReshardError, match="num_kv_heads: 2 != 4"):
        check_reshardable(_group(2, 1), _group(4, 2))


@pytest.mark.parametrize("ranges", [
    ((0, 1), (2, 3)),          # a gap
    ((0, 2), (1, 2)),          # ranges of different sizes
    ((-1, 0), (0, 1)),         # negative
    ((1, 2), (2, 3)),          # not from head 0
])
def test_head_ranges_that_are_no_cache_are_refused(ranges: tuple[tuple[int, int], ...]) -> None:
    layout = replace(BASE, tensor_parallel_size=2)
    with pytest.raises(ReshardError):
        GroupKv(layout, ranges)


def test_the_group_round_trips_its_wire_map_and_refuses_hostile_ones() -> None:
    g = _group(3, 3)
    assert GroupKv.from_wire(g.to_wire()) == g
    assert GroupKv.single(BASE) == GroupKv(BASE, ((0, 1),))
    for bad in (None, {"layout": BASE.to_wire(), "head_ranges": [[0, "1"]]},
                {"layout": BASE.to_wire(), "head_ranges": [[0, 1]] * 5000},
                {"layout": BASE.to_wire(), "head_ranges": [[0, 1, 2]]},
                {"layout": "x", "head_ranges": [[0, 1]]}):
        with pytest.raises(MalformedFrame):
            GroupKv.from_wire(bad)
    with pytest.raises(ReshardError, match="2 head ranges"):  # the ranges and the layout's size
        GroupKv.from_wire({"layout": BASE.to_wire(), "head_ranges": [[0, 1], [1, 2]]})


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize(("nkv", "a", "b"), [(3, 1, 3), (3, 3, 1), (2, 2, 1), (1, 1, 2)])
def test_routes_move_their_head_windows_between_caches_and_nothing_else(
        dtype: str, nkv: int, a: int, b: int) -> None:
    """The issue's handoffs at the byte level: each route's slice goes from a prefill rank's
    cache to a decode rank's through window spans (the frames' payload path); every decode
    rank ends with its heads of the prompt's blocks, nothing else written, and the bytes
    sent are one whole cache's (per decode replica)."""
    import torch

    from tandem.kv_transfer.blocks import TORCH_DTYPES, KvBlocks, RecvSpan, SendSpan

    tdt = TORCH_DTYPES[dtype]
    src, dst = _group(nkv, a), _group(nkv, b)
    src_layout, dst_layout = (replace(g.layout, kv_dtype=dtype) for g in (src, dst))
    whole = (torch.randn(2, 2, 6, 4, nkv, 8) * 20).to(tdt)
    src_kvs = [whole[..., s:e, :].contiguous() for s, e in src.head_ranges]
    dst_kvs = [torch.zeros(2, 2, 7, 4, e - s, 8, dtype=tdt) for s, e in dst.head_ranges]
    src_ids, dst_ids = [4, 1, 3], [0, 5, 2]
    sent_bytes = 0
    for r in routes(src, dst):
        out = KvBlocks(src_kvs[r.src], src_layout).window(r.src_offset, r.src_offset + r.heads)
        into = KvBlocks(dst_kvs[r.dst], dst_layout).window(r.dst_offset, r.dst_offset + r.heads)
        assert out.layout == into.layout  # both ends state the same route layout
        sent, got = SendSpan(out, 0, 2, src_ids), RecvSpan(into, 0, 2, dst_ids)
        bounce = np.empty(sent.nbytes, dtype=np.uint8)
        at = 0
        for piece in sent.chunks(bounce):
            got.target(at, piece.nbytes, bounce)[:] = piece
            got.land(at, got.target(at, piece.nbytes, bounce))
            at += piece.nbytes
        got.finish()
        sent_bytes += at
    single = replace(BASE, kv_dtype=dtype, num_kv_heads=nkv)
    replicas = max(1, b // nkv)  # 1 but for (1, 1, 2): each decode replica gets its copy
    assert sent_bytes == single.payload_bytes(2, 3) * replicas
    untouched = [blk for blk in range(7) if blk not in dst_ids]
    for (s, e), kv in zip(dst.head_ranges, dst_kvs, strict=True):
        assert torch.equal(kv[:, :, dst_ids], whole[:, :, src_ids, :, s:e])
        assert not kv[:, :, untouched].any()


def test_a_window_outside_the_cache_is_refused() -> None:
    import torch

    from tandem.kv_transfer.blocks import KvBlocks
    from tandem.kv_transfer.errors import TransferSpecError

    blocks = KvBlocks(torch.zeros(2, 2, 3, 4, 2, 8), replace(BASE, num_kv_heads=2))
    for start, stop in ((0, 3), (1, 1), (-1, 1)):
        with pytest.raises(TransferSpecError):
            blocks.window(start, stop)
    with pytest.raises(TransferSpecError):
        blocks.window(0, 1).window(0, 1)


@pytest.mark.parametrize(("a", "b"), [(1, 2), (2, 1), (2, 4), (4, 2), (8, 1)])
def test_a_latent_cache_is_sent_once_from_a_group_and_copied_into_each_rank(a: int,
                                                                            b: int) -> None:
    """MLA: every rank holds the one latent head (the plan replicates it), so a prefill group
    sends it from rank 0 only (the bytes of a single-rank push) and each decode rank gets it."""
    latent = replace(BASE, head_dim=40, kv_lora_rank=32)

    def group(world: int) -> GroupKv:
        plan = plan_shards(world, num_heads=8, num_kv_heads=8, head_dim=12,
                           intermediate_size=8, mla=True)
        return GroupKv(replace(latent, tensor_parallel_size=world if world > 1 else 0),
                       tuple((s.start, s.stop) for s in plan.kv_head_ranges()))

    got = routes(group(a), group(b))
    assert [(r.src, r.dst, r.start, r.stop) for r in got] == [(0, d, 0, 1) for d in range(b)]
    assert pushed_heads(group(a), group(b)) == b
    assert all(committer(got, d) == 0 and parts_into(got, d) == 1 for d in range(b))
