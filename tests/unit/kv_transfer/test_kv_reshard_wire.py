"""Re-sharded pushes over real connections: each prefill rank's Sender pushes its routes
(HELLO states the route, BEGIN the parts) into the decode ranks' Receivers, the committing
route of each decode rank commits after the others finished; every decode rank's blocks equal
its heads of the prompt, the bytes are a single-rank push's, and nothing is held afterwards.
A group whose layout cannot be re-sharded is refused at HELLO with a typed error."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
import torch

from tandem.kv_transfer import (
    Committed,
    LayoutMismatchError,
    Receiver,
    ReceiverConfig,
    Sender,
    SenderConfig,
)
from tandem.kv_transfer.reshard import GroupKv, committer, parts_into, routes
from tandem.kv_transfer.testing import TEST_SECRET, deadline, run, settle_and_check, tiny_layout
from tandem.kv_transfer.transport.shm import ShmTransport
from tandem.kv_transfer.transport.tcp import TcpTransport


def _group(base, nkv: int, world: int) -> GroupKv:
    per = max(1, nkv // world)
    ranges = tuple((r * per, (r + 1) * per) if nkv >= world else
                   (r // (world // nkv), r // (world // nkv) + 1) for r in range(world))
    return GroupKv(replace(base, num_kv_heads=per, tensor_parallel_size=world if world > 1
                           else 0), ranges)


def _transports(kind: str, rx: bool):
    cfg = ReceiverConfig(TEST_SECRET)
    if kind == "shm":
        return [ShmTransport(cfg.limits, slots=cfg.shm_slots, slot_bytes=cfg.shm_slot_bytes,
                             socket_dir=cfg.socket_dir)] if rx else [ShmTransport(cfg.limits)]
    return [TcpTransport(cfg.limits)]


async def _push(src: GroupKv, dst: GroupKv, kind: str, *, forked: int = 1,
                stripes: int = 1) -> None:
    base = tiny_layout("bfloat16", layers=3, heads=1)
    nkv = src.total_kv_heads
    whole = torch.randn(3, 2, 9, 4, nkv, 8, generator=torch.Generator().manual_seed(nkv)
                        ).to(torch.bfloat16)
    src_kvs = [whole[..., a:b, :].contiguous() for a, b in src.head_ranges]
    dst_kvs = [torch.zeros(3, 2, 12, 4, b - a, 8, dtype=torch.bfloat16)
               for a, b in dst.head_ranges]
    rxs = [Receiver(kv, dst.layout, ReceiverConfig(TEST_SECRET, max_stripes=4),
                    _transports(kind, True), group=dst, rank=r) for r, kv in enumerate(dst_kvs)]
    endpoints = [await rx.start() for rx in rxs]
    txs = [Sender(kv, src.layout, SenderConfig(TEST_SECRET, stripes=stripes, prefer_shm=True),
                  _transports(kind, False), group=src, rank=r)
           for r, kv in enumerate(src_kvs)]
    src_ids, dst_ids = [7, 2, 5], [10, 0, 4]
    for rx in rxs:
        rx.reserve("t1", dst_ids, lease_s=30)
    every = routes(src, dst)
    opened = {}
    for r in every:
        opened[r] = await txs[r.src].open("t1", endpoints[r.dst], None, dst_ids, deadline(),
                                          route=r, parts=parts_into(every, r.dst))
        for layer in range(base.num_layers):  # layer by layer, as prefill computes them
            if layer == 0:
                opened[r].set_source(src_ids)
            opened[r].push(layer, layer + 1)
    firsts = [(5 + j, -0.5) for j in range(1, forked)]
    # parts that do not commit finish; then every decode rank but 0 is committed; rank 0 last
    await asyncio.gather(*(t.finish_part() for r, t in opened.items()
                           if committer(every, r.dst) != r.src))
    commits = {r.dst: t for r, t in opened.items() if committer(every, r.dst) == r.src}
    for d in sorted(commits, reverse=True):
        await commits[d].commit(5, -0.5, forked=firsts)
    for d, rx in enumerate(rxs):
        event = await rx.events.get()
        assert isinstance(event, Committed) and event.transfer_id == "t1"
        assert event.forked_tokens == tuple(t for t, _ in firsts)
        a, b = dst.head_ranges[d]
        assert torch.equal(dst_kvs[d][:, :, dst_ids], whole[:, :, src_ids, :, a:b])
    sent = sum(rx.stats().bytes_received for rx in rxs)
    replicas = max(1, dst.world // nkv)
    assert sent == replace(base, num_kv_heads=nkv).payload_bytes(3, 3) * replicas
    for rx in rxs:
        await settle_and_check(rx, *txs)
        await rx.close()


@pytest.mark.parametrize(("nkv", "a", "b"), [(3, 1, 3), (3, 3, 1), (2, 2, 1), (1, 2, 1),
                                             (2, 1, 4), (6, 3, 2)])
def test_a_re_sharded_push_lands_every_rank_s_heads(nkv: int, a: int, b: int) -> None:
    base = tiny_layout("bfloat16", layers=3, heads=1)
    run(_push(_group(base, nkv, a), _group(base, nkv, b), "tcp"))


def test_a_re_sharded_push_over_shm_striped_and_forked() -> None:
    base = tiny_layout("bfloat16", layers=3, heads=1)
    run(_push(_group(base, 3, 3), _group(base, 3, 1), "shm", forked=3))
    run(_push(_group(base, 3, 1), _group(base, 3, 3), "tcp", stripes=2))


def test_a_group_that_cannot_be_re_sharded_is_refused_at_hello() -> None:
    async def body() -> None:
        base = tiny_layout("bfloat16", layers=3, heads=1)
        src = _group(base, 3, 3)
        other = _group(replace(base, block_size=8), 3, 1)  # another block size
        rx = Receiver(torch.zeros(3, 2, 4, 8, 3, 8, dtype=torch.bfloat16), other.layout,
                      ReceiverConfig(TEST_SECRET), _transports("tcp", True), group=other)
        endpoint = await rx.start()
        tx = Sender(torch.zeros(3, 2, 4, 4, 1, 8, dtype=torch.bfloat16), src.layout,
                    SenderConfig(TEST_SECRET), _transports("tcp", False), group=src, rank=1)
        rx.reserve("t", [0], lease_s=30)
        route = routes(src, _group(base, 3, 1))[1]  # rank 1's head, as if the sizes matched
        with pytest.raises(LayoutMismatchError, match="block_size: 4 != 8"):
            await tx.open("t", endpoint, [0], [0], deadline(), route=route, parts=3)
        assert rx.refusals["layout"] == 1
        rx.release("t")
        await settle_and_check(rx, tx)
        await rx.close()

    run(body())


def test_a_commit_that_overtakes_the_other_parts_begin_waits_for_them() -> None:
    """Each part of a re-sharded push is its own connection, read on its own: the committing
    part's COMMIT can reach the receiver before another part's BEGIN does. Forced here: the
    committing part commits before the others even open; the receiver waits for them (its
    lease bounds the wait) instead of refusing the push as incomplete."""
    base = tiny_layout("bfloat16", layers=3, heads=1)
    src, dst = _group(base, 3, 3), _group(base, 3, 1)

    async def go() -> None:
        whole = torch.randn(3, 2, 9, 4, 3, 8, generator=torch.Generator().manual_seed(4)
                            ).to(torch.bfloat16)
        kv = torch.zeros(3, 2, 12, 4, 3, 8, dtype=torch.bfloat16)
        rx = Receiver(kv, dst.layout, ReceiverConfig(TEST_SECRET), _transports("tcp", True),
                      group=dst, rank=0)
        endpoint = await rx.start()
        txs = [Sender(whole[..., r:r + 1, :].contiguous(), src.layout,
                      SenderConfig(TEST_SECRET), _transports("tcp", False), group=src, rank=r)
               for r in range(3)]
        rx.reserve("t1", [10, 0, 4], lease_s=30)
        every = routes(src, dst)
        first = next(r for r in every if committer(every, r.dst) == r.src)
        others = [r for r in every if r != first]

        async def part(r):
            t = await txs[r.src].open("t1", endpoint, [7, 2, 5], [10, 0, 4], deadline(),
                                      route=r, parts=parts_into(every, r.dst))
            t.push(0, base.num_layers)
            return t

        committing = await part(first)
        commit = asyncio.ensure_future(committing.commit(5, -0.5))
        while not (commit.done() or "t1" in rx._landing):  # the COMMIT has been read
            await asyncio.sleep(0)
        assert not commit.done(), commit.exception()
        for t in [await part(r) for r in others]:
            await t.finish_part()
        await commit
        event = await rx.events.get()
        assert isinstance(event, Committed) and event.transfer_id == "t1"
        assert torch.equal(kv[:, :, [10, 0, 4]], whole[:, :, [7, 2, 5]])
        await settle_and_check(rx, *txs)
        await rx.close()

    run(go())
