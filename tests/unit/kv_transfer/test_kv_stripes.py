"""Transfers striped over several TCP connections (SenderConfig.stripes, negotiated against the
receiver's max_stripes): bit-exact with fragmented and contiguous ids and under a codec, a
COMMIT that overtakes another stripe's frames waits for them, a lost stripe ends the transfer,
and BEGINs that try to join beyond what was announced are refused."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tandem.kv_transfer import Aborted, Committed, ConnectionLost, ReceiverConfig, SenderConfig
from tandem.kv_transfer.frames import Kind
from tandem.kv_transfer.testing import (
    TEST_SECRET,
    RawPeer,
    blocks_equal,
    deadline,
    finish,
    make_pair,
    run,
    tiny_layout,
)

LAYOUT = tiny_layout("bfloat16", layers=3)
FRAGMENTED, CONTIGUOUS = ([3, 7, 1, 12, 9, 4], [14, 2, 5, 0, 11, 8]), (list(range(2, 8)),
                                                                          list(range(6, 12)))


@pytest.mark.parametrize("ids", [FRAGMENTED, CONTIGUOUS], ids=["fragmented", "contiguous"])
@pytest.mark.parametrize("codec", ["raw", "int8"])
def test_a_striped_transfer_spreads_its_frames_and_lands_whole(ids, codec: str) -> None:
    async def body() -> None:
        p = await make_pair("tcp", LAYOUT, rx_config=ReceiverConfig(
            TEST_SECRET, codecs=("int8",)), tx_config=SenderConfig(
            TEST_SECRET, stripes=3, codec=codec))
        src, dst = ids
        if codec == "int8":  # finite values: int8 needs them to go encoded
            p.src.copy_(torch.randn(p.src.shape, generator=torch.Generator().manual_seed(0)))
        p.rx.reserve("t", dst, lease_s=30)
        t = await p.tx.open("t", p.endpoint, src, dst, deadline())
        assert len(t.stripes) == 3 and len({id(c) for c in t.stripes}) == 3
        for layer in range(LAYOUT.num_layers):
            t.push(layer, layer + 1)
        await t.commit(9, -0.25)
        event = await p.rx.events.get()
        assert isinstance(event, Committed) and event.block_ids == tuple(dst)
        if codec == "raw":
            assert blocks_equal(p.src, src, p.dst, dst)
        else:
            err = (p.dst[:, :, dst].float() - p.src[:, :, src].float()).abs()
            assert 0 < err.max() <= p.src[:, :, src].float().abs().max() / 127
        assert p.tx.stats().connections == 3
        await finish(p)

    run(body())


def test_the_receiver_caps_the_stripes() -> None:
    async def body() -> None:
        p = await make_pair("tcp", LAYOUT, rx_config=ReceiverConfig(TEST_SECRET, max_stripes=1),
                            tx_config=SenderConfig(TEST_SECRET, stripes=4))
        p.rx.reserve("t", FRAGMENTED[1], lease_s=30)
        t = await p.tx.open("t", p.endpoint, *FRAGMENTED, deadline())
        assert len(t.stripes) == 1
        t.push(0, LAYOUT.num_layers)
        await t.commit(1, 0.0)
        assert isinstance(await p.rx.events.get(), Committed)
        assert blocks_equal(p.src, FRAGMENTED[0], p.dst, FRAGMENTED[1])
        await finish(p)

    run(body())


def test_losing_one_stripe_ends_the_transfer_on_both_sides() -> None:
    async def body() -> None:
        p = await make_pair("tcp", LAYOUT, tx_config=SenderConfig(TEST_SECRET, stripes=2))
        p.rx.reserve("t", FRAGMENTED[1], lease_s=30)
        t = await p.tx.open("t", p.endpoint, *FRAGMENTED, deadline())
        await p.rx.wait_until(lambda s: s.connections == 2 and s.bound_transfers == 1)
        t.stripes[1].close("test: the second stripe is cut")
        event = await p.rx.events.get()
        assert isinstance(event, Aborted) and event.code == "connection_lost"
        assert isinstance(await t.wait_ended(), ConnectionLost)
        await finish(p)

    run(body())


def _kv(layer: int) -> tuple[dict[str, object], bytes]:
    header = {"kind": Kind.KV, "transfer": "t", "layers": [layer, layer + 1], "blocks": [3],
              "dtype": LAYOUT.kv_dtype, "shape": LAYOUT.payload_shape(1, 1),
              "nbytes": LAYOUT.payload_bytes(1, 1)}
    return header, bytes([layer + 1]) * LAYOUT.payload_bytes(1, 1)


def test_a_commit_that_overtakes_a_stripe_waits_for_its_frames() -> None:
    async def body() -> None:
        p = await make_pair("tcp", LAYOUT, dst_blocks=8)
        a, b = await RawPeer.connect(p.endpoint), await RawPeer.connect(p.endpoint)
        for peer in (a, b):
            assert (await peer.handshake(LAYOUT))["max_stripes"] == 4
        p.rx.reserve("t", [3], lease_s=30)
        for peer in (b, a):  # the stripe's BEGIN first: either order binds
            await peer.send_frame({"kind": Kind.BEGIN, "transfer": "t", "blocks": [3],
                                   "stripes": 2})
        await p.rx.wait_until(lambda s: s.bound_transfers == 1)
        for layer in (0, 1):
            await a.send_frame(*_kv(layer))
        await a.send_frame({"kind": Kind.COMMIT, "transfer": "t", "token": 4, "logprob": -1.0})
        await p.rx.wait_until(lambda s: s.waiting_commits == 1)  # layer 2 is still missing
        await b.send_frame(*_kv(2))
        assert (await a.recv_frame())["ref"] == Kind.COMMIT
        event = await p.rx.events.get()
        assert isinstance(event, Committed) and event.first_token == 4
        assert [int(p.dst[layer, 0, 3].view(torch.uint8)[0, 0, 0]) for layer in range(3)] == \
            [1, 2, 3]
        a.close()
        b.close()
        await finish(p)

    run(body())


@pytest.mark.parametrize("case", ["over_the_announced", "other_count", "other_blocks",
                                  "over_the_receiver_cap"])
def test_begins_beyond_the_stripes_are_refused(case: str) -> None:
    async def body() -> None:
        p = await make_pair("tcp", LAYOUT, dst_blocks=8)
        peers = [await RawPeer.connect(p.endpoint) for _ in range(3)]
        for peer in peers:
            await peer.handshake(LAYOUT)
        p.rx.reserve("t", [3, 4], lease_s=30)
        announced = 3 if case == "other_blocks" else 2  # other_blocks: room for a third
        begin = {"kind": Kind.BEGIN, "transfer": "t", "blocks": [3, 4], "stripes": announced}
        if case == "over_the_receiver_cap":
            await peers[0].send_frame({**begin, "stripes": 5})
            nack = await peers[0].recv_frame()
            assert nack["kind"] == Kind.NACK and nack["code"] == "bad_frame"
            assert await peers[0].closed_by_peer()
        else:
            await peers[0].send_frame(begin)
            await peers[1].send_frame(begin)
            await p.rx.wait_until(lambda s: s.bound_transfers == 1)
            late = {"over_the_announced": begin, "other_count": {**begin, "stripes": 4},
                    "other_blocks": {**begin, "blocks": [3]}}[case]
            await peers[2].send_frame(late)
            nack = await peers[2].recv_frame()
            want = "block_mismatch" if case == "other_blocks" else "busy"
            assert nack["kind"] == Kind.NACK and nack["code"] == want, nack
            res = p.rx.table.get("t")
            assert res is not None and len(res.conns) == 2
        p.rx.release("t")
        for peer in peers:
            peer.close()
        await finish(p)

    run(body())


def test_stripes_must_be_positive() -> None:
    from tandem.kv_transfer import ConfigError

    with pytest.raises(ConfigError):
        SenderConfig(TEST_SECRET, stripes=0)
    with pytest.raises(ConfigError):
        ReceiverConfig(TEST_SECRET, max_stripes=0)
    assert asyncio.iscoroutinefunction(RawPeer.handshake)
