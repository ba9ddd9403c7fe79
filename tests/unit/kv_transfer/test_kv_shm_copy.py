"""The shm path's single copies: the sender gathers blocks straight into a slot, the receiver
scatters straight out of it, each hashing a piece right after copying it (or not at all on a
link whose receiver turned the hash off). Checked byte for byte against plain tensor
indexing, with fragmented and contiguous ids; a slot rewritten after it was hashed is caught
when the link hashes, and lands only in the transfer's own blocks when it does not."""

from __future__ import annotations

import asyncio
import os
import socket

import numpy as np
import pytest
import torch
import xxhash

from tandem.kv_transfer import Aborted, Committed, ReceiverConfig, SenderConfig
from tandem.kv_transfer.blocks import KvBlocks, SendSpan
from tandem.kv_transfer.config import Limits
from tandem.kv_transfer.errors import MalformedFrame
from tandem.kv_transfer.frames import HeaderCodec, Kind
from tandem.kv_transfer.testing import (
    TEST_SECRET,
    HandSender,
    deadline,
    finish,
    make_pair,
    random_cache,
    run,
    tiny_layout,
)
from tandem.kv_transfer.transport import ShmTransport
from tandem.kv_transfer.transport.shm import ShmChannel

FRAGMENTED = ([13, 2, 9, 0, 31, 7, 22, 5], [4, 30, 11, 19, 1, 26, 8, 15])
CONTIGUOUS = (list(range(8, 16)), list(range(20, 28)))


def _reference(kv: torch.Tensor, lo: int, hi: int, ids: list[int]) -> bytes:
    """``kv[lo:hi, :, ids]`` in payload order, by plain tensor indexing."""
    return kv[lo:hi][:, :, ids].contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("step_rows", [1, 3, 1000])
def test_fill_gathers_the_payload_in_order_into_the_given_array(staged: bool,
                                                                step_rows: int) -> None:
    layout = tiny_layout("bfloat16", layers=3)
    kv = random_cache(layout, 32, seed=4)
    blocks = KvBlocks(kv, layout, staged=staged)
    ids = FRAGMENTED[0]
    span = SendSpan(blocks, 1, 3, ids)
    out = np.full(span.nbytes + 64, 0xEE, dtype=np.uint8)  # room past the payload stays as is
    hasher = xxhash.xxh3_64()
    pieces = []
    for piece in span.fill(out, step_rows * layout.block_bytes):
        assert piece.nbytes % layout.block_bytes == 0 and piece.nbytes > 0
        hasher.update(piece)
        pieces.append(piece.tobytes())
    span.release()
    want = _reference(kv, 1, 3, ids)
    assert out[:span.nbytes].tobytes() == want
    assert b"".join(pieces) == want
    assert bool((out[span.nbytes:] == 0xEE).all())
    assert hasher.intdigest() == xxhash.xxh3_64_intdigest(want)  # streamed = one-shot


@pytest.mark.parametrize("ids", [FRAGMENTED, CONTIGUOUS], ids=["fragmented", "contiguous"])
@pytest.mark.parametrize("checksum", [True, False], ids=["hashed", "unhashed"])
@pytest.mark.parametrize("kind", ["shm", "shm_staged"])
def test_shm_round_trip_is_bit_exact_with_or_without_the_slot_hash(
        kind: str, checksum: bool, ids: tuple[list[int], list[int]]) -> None:
    """Frames of a few rows (several copy pieces each, over two slots), pushed layer by layer
    and then whole; every reserved block lands, no other is touched, nothing stays held."""
    async def body() -> None:
        layout = tiny_layout("bfloat16", layers=4)
        src_ids, dst_ids = ids
        rx_cfg = ReceiverConfig(TEST_SECRET, shm_checksum=checksum, shm_slots=2,
                                shm_slot_bytes=3 * layout.payload_bytes(1, len(dst_ids)))
        tx_cfg = SenderConfig(TEST_SECRET, frame_bytes=5 * layout.payload_bytes(1, 1))
        p = await make_pair(kind, layout, src_blocks=32, dst_blocks=32, rx_config=rx_cfg,
                            tx_config=tx_cfg, seed=6)
        for tid, pushes in (("by-layer", [(i, i + 1) for i in range(layout.num_layers)]),
                            ("whole", [(0, layout.num_layers)])):
            p.rx.reserve(tid, dst_ids, lease_s=30)
            t = await p.tx.open(tid, p.endpoint, src_ids, dst_ids, deadline())
            for lo, hi in pushes:
                t.push(lo, hi)
            await t.commit(5, -0.5)
            assert await p.rx.events.get() == Committed(tid, tuple(dst_ids), 5, -0.5)
            assert _reference(p.dst, 0, layout.num_layers, dst_ids) == \
                _reference(p.src, 0, layout.num_layers, src_ids)
            p.dst.zero_()  # the next push must write every byte again
        untouched = [b for b in range(32) if b not in dst_ids]
        assert not p.dst[:, :, untouched].view(torch.uint8).any()
        await finish(p)

    run(body())


@pytest.mark.parametrize("checksum", [True, False], ids=["hashed", "unhashed"])
def test_a_slot_rewritten_after_its_hash_is_refused_or_stays_in_its_blocks(
        checksum: bool) -> None:
    """A sender rewrites a slot between hashing it and the receiver's copy. Hashed link: the
    frame is refused (NACK checksum), the transfer aborted, its blocks freed, nothing of it
    counted. Unhashed link: the rewritten bytes land, in the transfer's own blocks only (no
    worse than a sender sending wrong KV). Either way the connection carries on."""
    async def body() -> None:
        layout = tiny_layout("float16", layers=2)
        rx_cfg = ReceiverConfig(TEST_SECRET, shm_checksum=checksum)
        p = await make_pair("shm", layout, rx_config=rx_cfg)
        peer = await HandSender.connect(ShmTransport(rx_cfg.limits), p.endpoint, layout)
        victim, other = [3, 4], [9]
        n = layout.payload_bytes(1, len(victim))
        sent = bytes(range(256)) * (n // 256) + bytes(n % 256)
        rewritten = bytes(b ^ 0xFF for b in sent)
        p.rx.reserve("v", victim, lease_s=30)
        await peer.send({"kind": Kind.BEGIN, "transfer": "v", "blocks": victim})
        rest = await peer.hold_kv("v", victim, 0, 1, sent, rewrite=rewritten)
        await rest()
        if checksum:
            reply = await peer.recv()
            assert (reply["kind"], reply["transfer"], reply["code"]) == (Kind.NACK, "v",
                                                                         "checksum")
            event = await p.rx.events.get()
            assert isinstance(event, Aborted) and event.code == "checksum"
            assert p.rx.stats().bytes_received == 0
        else:
            await peer.send_kv("v", victim, 1, 2, sent)
            await peer.send({"kind": Kind.COMMIT, "transfer": "v", "token": 1, "logprob": 0.0})
            ack = await peer.recv()
            assert (ack["kind"], ack["transfer"]) == (Kind.ACK, "v")
            assert isinstance(await p.rx.events.get(), Committed)
            assert _reference(p.dst, 0, 1, victim) == rewritten
            p.rx.release("v")
        untouched = [b for b in range(16) if b not in victim]
        assert not p.dst[:, :, untouched].view(torch.uint8).any()
        # the connection still carries a whole transfer
        good = bytes(reversed(sent))[: layout.payload_bytes(2, len(other))].ljust(
            layout.payload_bytes(2, len(other)), b"\x01")
        p.rx.reserve("next", other, lease_s=30)
        await peer.send({"kind": Kind.BEGIN, "transfer": "next", "blocks": other})
        await peer.send_kv("next", other, 0, 2, good)
        await peer.send({"kind": Kind.COMMIT, "transfer": "next", "token": 2, "logprob": 0.0})
        ack = await peer.recv()
        assert (ack["kind"], ack["transfer"]) == (Kind.ACK, "next")
        assert _reference(p.dst, 0, 2, other) == good
        assert isinstance(await p.rx.events.get(), Committed)
        peer.close()
        await finish(p)

    run(body())


@pytest.mark.parametrize("flag", ["no", 0, 1, None, [True]])
def test_an_ack_whose_hash_choice_is_not_a_bool_is_refused_and_its_segment_closed(flag) -> None:
    """The receiver's ACK says whether senders hash (``shm_xxh``); anything but a bool is a
    malformed ACK: refused before the segment is mapped, the received descriptor closed."""
    async def body() -> None:
        a, b = socket.socketpair(socket.AF_UNIX)
        try:
            ch = ShmChannel(a, HeaderCodec(Limits()), server=False, slots=2, slot_bytes=4096,
                            max_payload=4096, peer="test")
            good = {"shm_slots": 2, "shm_slot_bytes": 4096}
            fd = os.memfd_create("t", os.MFD_CLOEXEC)
            os.ftruncate(fd, 2 * 4096)
            ch.received_fds = [fd]
            with pytest.raises(MalformedFrame):
                ch.client_setup({**good, "shm_xxh": flag})
            with pytest.raises(OSError):
                os.fstat(fd)  # closed by the refusal
            assert ch.checksum is True and ch.buffered_bytes == 0  # nothing mapped
            fd = os.memfd_create("t", os.MFD_CLOEXEC)
            os.ftruncate(fd, 2 * 4096)
            ch.received_fds = [fd]
            ch.client_setup({**good, "shm_xxh": False})  # a bool: the sender stops hashing
            assert ch.checksum is False and ch.buffered_bytes >= 2 * 4096
            ch.close()
        finally:
            a.close()
            b.close()

    asyncio.run(body())
