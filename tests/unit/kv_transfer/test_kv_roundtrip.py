"""Bit-exact round trips over every transport, alone and many at once."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from tandem.kv_transfer import Committed, Endpoint, ReceiverConfig, SenderConfig, TlsConfig
from tandem.kv_transfer.testing import (
    PAIR_KINDS,
    TEST_SECRET,
    blocks_equal,
    deadline,
    finish,
    make_pair,
    run,
    tiny_layout,
)

DTYPES = ("float32", "float16", "bfloat16", "float8_e4m3fn")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", PAIR_KINDS)
def test_round_trip_is_bit_exact(kind: str, dtype: str, tls_config: TlsConfig) -> None:
    async def body() -> None:
        layout = tiny_layout(dtype)
        p = await make_pair(kind, layout, tls=tls_config)
        src_ids, dst_ids = [3, 7, 1, 12], [9, 2, 14, 5]
        p.rx.reserve("t-1", dst_ids, lease_s=30)
        t = await p.tx.open("t-1", p.endpoint, src_ids, dst_ids, deadline())
        for layer in range(layout.num_layers):  # layer by layer, as prefill computes them
            t.push(layer, layer + 1)
        await t.commit(17, -1.25)
        assert await p.rx.events.get() == Committed("t-1", tuple(dst_ids), 17, -1.25)
        assert blocks_equal(p.src, src_ids, p.dst, dst_ids)
        untouched = [b for b in range(16) if b not in dst_ids]
        assert not p.dst[:, :, untouched].view(torch.uint8).any()
        assert await t.wait_ended() is None
        await finish(p)

    run(body())


@pytest.mark.parametrize("kind", PAIR_KINDS)
def test_many_concurrent_transfers_into_interleaved_blocks(kind: str,
                                                           tls_config: TlsConfig) -> None:
    """8 transfers at once, destination ids interleaved (transfer i owns i, i+8, i+16...),
    frames small enough to split every layer, two pooled connections."""
    async def body() -> None:
        layout = tiny_layout("bfloat16", layers=4)
        one_block = layout.payload_bytes(1, 1)
        tx_cfg = SenderConfig(TEST_SECRET, frame_bytes=3 * one_block,
                              max_connections_per_endpoint=2)
        p = await make_pair(kind, layout, src_blocks=64, dst_blocks=64, tx_config=tx_cfg,
                            tls=tls_config, seed=5)
        n, per = 8, 8
        src_pool = list(range(64))
        random.Random(1).shuffle(src_pool)
        plan = {f"t{i}": (src_pool[i * per:(i + 1) * per], list(range(i, 64, n)))
                for i in range(n)}
        for tid, (_, dst) in plan.items():
            p.rx.reserve(tid, dst, lease_s=30)

        async def one(tid: str, token: int) -> None:
            src, dst = plan[tid]
            t = await p.tx.open(tid, p.endpoint, src, dst, deadline())
            for layer in range(layout.num_layers):
                await t.send_layers(layer, layer + 1)
                await asyncio.sleep(0)  # let the other transfers' frames interleave
            await t.commit(token, -0.5)

        await asyncio.gather(*(one(tid, i) for i, tid in enumerate(plan)))
        events = [await p.rx.events.get() for _ in plan]
        assert sorted(e.transfer_id for e in events) == sorted(plan)
        assert all(isinstance(e, Committed) for e in events)
        for tid, (src, dst) in plan.items():
            assert blocks_equal(p.src, src, p.dst, dst), tid
        assert p.tx.stats().connections <= 2
        await finish(p)

    run(body())


def test_forked_commit_carries_every_sequences_first_token() -> None:
    """One push of a forked request's prompt; COMMIT names its n sequences' first tokens."""
    async def body() -> None:
        layout = tiny_layout("float32")
        p = await make_pair("tcp", layout)
        p.rx.reserve("fork", [0, 1], lease_s=30)
        t = await p.tx.open("fork", p.endpoint, [4, 5], [0, 1], deadline())
        t.push(0, layout.num_layers)
        await t.commit(17, -1.25, forked=[(3, -0.5), (250, -4.0), (17, -1.25)])
        event = await p.rx.events.get()
        assert isinstance(event, Committed)
        assert event.first_tokens == (17, 3, 250, 17)
        assert event.first_logprobs == (-1.25, -0.5, -4.0, -1.25)
        assert blocks_equal(p.src, [4, 5], p.dst, [0, 1])
        await finish(p)

    run(body())


def test_send_pushes_everything_and_commits() -> None:
    async def body() -> None:
        layout = tiny_layout("float32", layers=5)
        p = await make_pair("tcp", layout)
        p.rx.reserve("whole", [0, 1, 2], lease_s=30)
        await p.tx.send("whole", p.endpoint, [4, 5, 6], [0, 1, 2], first_token=3, logprob=-2.0,
                        deadline=deadline())
        event = await p.rx.events.get()
        assert isinstance(event, Committed) and event.first_token == 3
        assert blocks_equal(p.src, [4, 5, 6], p.dst, [0, 1, 2])
        await finish(p)

    run(body())


def test_sender_falls_back_to_tcp_when_shm_is_unreachable(tmp_path: object) -> None:
    async def body() -> None:
        layout = tiny_layout()
        p = await make_pair("tcp", layout)
        tcp = p.endpoint.address("tcp")
        assert tcp is not None
        broken = Endpoint(p.endpoint.host_id, (("shm", "/nonexistent/kv.sock"), ("tcp", tcp)))
        from tandem.kv_transfer import Sender
        from tandem.kv_transfer.transport import ShmTransport, TcpTransport

        cfg = SenderConfig(TEST_SECRET)
        tx = Sender(p.src, layout, cfg, [ShmTransport(cfg.limits), TcpTransport(cfg.limits)])
        p.rx.reserve("fb", [1], lease_s=30)
        await tx.send("fb", broken, [2], [1], first_token=0, logprob=0.0, deadline=deadline())
        assert isinstance(await p.rx.events.get(), Committed)
        await tx.close()
        await finish(p)

    run(body())


def test_default_transports_pick_shm_on_the_same_host() -> None:
    async def body() -> None:
        from tandem.kv_transfer import Receiver, Sender
        from tandem.kv_transfer.testing import random_cache, settle_and_check, zero_cache

        layout = tiny_layout("bfloat16")
        rx = Receiver(zero_cache(layout, 8), layout, ReceiverConfig(TEST_SECRET))
        endpoint = await rx.start()
        assert endpoint.address("shm") and endpoint.address("tcp") and endpoint.same_host
        assert Endpoint.decode(endpoint.encode()) == endpoint
        tx = Sender(random_cache(layout, 8), layout, SenderConfig(TEST_SECRET))
        rx.reserve("auto", [0, 1], lease_s=30)
        await tx.send("auto", endpoint, [5, 6], [0, 1], first_token=1, logprob=0.0,
                      deadline=deadline())
        assert isinstance(await rx.events.get(), Committed)
        assert tx.stats().buffered_bytes > 0  # the shm segment is mapped: shm was chosen
        await settle_and_check(rx, tx)
        await rx.close()

    run(body())
