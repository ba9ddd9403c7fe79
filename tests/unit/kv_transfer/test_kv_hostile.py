"""A hostile peer: the receiver stays up, memory stays bounded, the offending connection is
closed with a logged reason, and other transfers carry on."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import socket
import struct
import tracemalloc
from pathlib import Path

import msgpack
import pytest
import torch

from tandem.kv_transfer import Aborted, ChannelClosed, Committed, ReceiverConfig
from tandem.kv_transfer.frames import PREFIX, Kind
from tandem.kv_transfer.testing import (
    TEST_SECRET,
    Pair,
    RawPeer,
    blocks_equal,
    deadline,
    finish,
    make_pair,
    run,
    tiny_layout,
)

LAYOUT = tiny_layout("bfloat16", layers=3)
BLOCK_PAYLOAD = LAYOUT.payload_bytes(1, 1)


def kv_header(tid: str, blocks: list[int], lo: int = 0, hi: int = 1) -> dict[str, object]:
    return {"kind": Kind.KV, "transfer": tid, "layers": [lo, hi], "blocks": blocks,
            "dtype": LAYOUT.kv_dtype, "shape": LAYOUT.payload_shape(hi - lo, len(blocks)),
            "nbytes": LAYOUT.payload_bytes(hi - lo, len(blocks))}


class _Touch:
    """Unpickling this would create a file: proof that nothing is ever unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, (f"touch {self.path}",))


async def _bystander(p: Pair, gate: asyncio.Event
                     ) -> tuple[asyncio.Task[None], list[int], list[int]]:
    """A legit transfer that runs through the whole attack on its own connection; it sends
    layer 0 now and the rest once ``gate`` is set."""
    src, dst = [1, 2], [30, 31]
    p.rx.reserve("legit", dst, lease_s=60)
    t = await p.tx.open("legit", p.endpoint, src, dst, deadline(60))
    await t.send_layers(0, 1)

    async def finish_later() -> None:
        await gate.wait()
        t.push(1, LAYOUT.num_layers)
        await t.commit(5, -0.1)

    return asyncio.get_running_loop().create_task(finish_later()), src, dst


async def _expect_closed(peer: RawPeer) -> None:
    assert await peer.closed_by_peer(), "receiver kept a hostile connection open"


def test_garbage_before_the_handshake_is_refused(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    sentinel = tmp_path / "pwned"

    async def body() -> None:
        p = await make_pair("tcp", LAYOUT, dst_blocks=32)
        gate = asyncio.Event()
        task: asyncio.Task[None] | None = None
        tracemalloc.start()
        try:
            base, _ = tracemalloc.get_traced_memory()
            attacks: list[bytes] = [
                PREFIX.pack(1 << 31),  # a 2 GiB header: refused before any allocation
                PREFIX.pack(0xFFFFFFFF) + b"x" * 100,
                PREFIX.pack(0),
                PREFIX.pack(50) + b"\x81" * 10,  # truncated header, then EOF
                PREFIX.pack(40_001) + b"\x91" * 40_000 + b"\x01",  # deeply nested msgpack
                (lambda b: PREFIX.pack(len(b)) + b)(pickle.dumps(_Touch(str(sentinel)))),
                pickle.dumps(_Touch(str(sentinel))),  # bare pickle, no prefix
                (lambda b: PREFIX.pack(len(b)) + b)(msgpack.packb([1, 2, 3])),  # not a map
                (lambda b: PREFIX.pack(len(b)) + b)(msgpack.packb({"kind": 99})),
                (lambda b: PREFIX.pack(len(b)) + b)(msgpack.packb(  # a version 1 sender
                    {"kind": Kind.HELLO, "version": 1, "nonce": b"n" * 16})),
                (lambda b: PREFIX.pack(len(b)) + b)(msgpack.packb(
                    {"kind": 1, "x": msgpack.ExtType(1, b"ext")}, use_bin_type=True)),
                os.urandom(4096),
            ]
            task, src, dst = await _bystander(p, gate)
            for data in attacks:
                peer = await RawPeer.connect(p.endpoint)
                await peer.send_raw(data)
                peer.half_close()
                await _expect_closed(peer)
                peer.close()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak - base < 4 << 20, f"receiver buffered {peak - base} bytes"
        gate.set()
        await task
        assert isinstance(await p.rx.events.get(), Committed)
        assert blocks_equal(p.src, src, p.dst, dst)
        refusals = p.rx.stats().refusals
        assert refusals.get("bad_frame", 0) >= 8 and refusals.get("version") == 1
        await finish(p)

    with caplog.at_level(logging.WARNING, logger="kv_transfer"):
        run(body())
    assert not sentinel.exists(), "a pickle was executed"
    assert "FrameTooLarge" in caplog.text and "MalformedFrame" in caplog.text


def test_hostile_frames_after_a_valid_handshake(caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        p = await make_pair("tcp", LAYOUT, dst_blocks=32)
        gate = asyncio.Event()
        task, src, dst = await _bystander(p, gate)

        async def attack(frames: list[dict[str, object]], payload: bytes = b"",
                         reserve: list[int] | None = None) -> list[dict[str, object]]:
            if reserve is not None:
                p.rx.reserve("victim", reserve, lease_s=30)
            peer = await RawPeer.connect(p.endpoint)
            await peer.handshake(LAYOUT)
            for header in frames:  # sealed as a member's: what is checked is the header
                await peer.send_raw(peer.seal(header)[0])
            await peer.send_raw(payload)
            replies = []
            with contextlib.suppress(ChannelClosed):
                while True:
                    replies.append(await peer.recv_frame())
            peer.close()
            return replies

        begin = {"kind": Kind.BEGIN, "transfer": "victim", "blocks": [3, 4]}
        # unknown kind, and a kind only the receiver may send
        await attack([{"kind": 42}])
        await attack([{"kind": Kind.ACK, "ref": 1}])
        await attack([{"kind": Kind.CREDIT, "slot": 0}])
        # KV whose shape does not match its block list
        bad_shape = {**kv_header("victim", [3, 4]), "shape": [1, 2, 3, 4, 2, 8]}
        await attack([begin, bad_shape], reserve=[3, 4])
        event = await p.rx.events.get()
        assert isinstance(event, Aborted) and event.code == "connection_lost"
        # KV naming a block outside the reservation
        replies = await attack([begin, kv_header("victim", [3, 9])], reserve=[3, 4])
        assert any(r.get("code") == "outside_reservation" for r in replies), replies
        assert isinstance(await p.rx.events.get(), Aborted)
        # a payload size no reservation can have (refused before reading the payload)
        huge = {**kv_header("victim", [3]), "blocks": list(range(60_000)),
                "shape": LAYOUT.payload_shape(1, 60_000),
                "nbytes": LAYOUT.payload_bytes(1, 60_000)}
        await attack([begin, huge], reserve=[3, 4])
        assert isinstance(await p.rx.events.get(), Aborted)
        # mistyped fields, negative numbers, a NaN logprob, an overlong id
        await attack([{"kind": Kind.BEGIN, "transfer": 7, "blocks": [1]}])
        await attack([{"kind": Kind.KV, **{k: v for k, v in kv_header("x", [1]).items()
                                             if k != "kind"}, "layers": [-1, 1]}])
        await attack([{"kind": Kind.COMMIT, "transfer": "x", "token": 1, "logprob": float("nan")}])
        # a forked COMMIT with more first tokens than any request may have sequences
        await attack([{"kind": Kind.COMMIT, "transfer": "x", "token": 1, "logprob": 0.0,
                       "tokens": [1] * 1000, "logprobs": [0.0] * 1000}])
        await attack([{"kind": Kind.BEGIN, "transfer": "x" * 500, "blocks": [1]}])
        gate.set()
        await task
        assert isinstance(await p.rx.events.get(), Committed)
        assert blocks_equal(p.src, src, p.dst, dst)
        await finish(p)

    with caplog.at_level(logging.WARNING, logger="kv_transfer"):
        run(body())
    assert "UnknownFrameKind" in caplog.text and "OutsideReservation" in caplog.text


def test_late_frames_are_nacked_and_the_connection_survives() -> None:
    async def body() -> None:
        p = await make_pair("tcp", LAYOUT, dst_blocks=32)
        peer = await RawPeer.connect(p.endpoint)
        await peer.handshake(LAYOUT)
        payload = os.urandom(BLOCK_PAYLOAD)
        # late: the reservation was released before the frame arrived
        p.rx.reserve("gone", [5], lease_s=30)
        await peer.send_frame({"kind": Kind.BEGIN, "transfer": "gone", "blocks": [5]})
        await p.rx.wait_until(lambda s: s.bound_transfers == 1)
        p.rx.release("gone")
        assert (await peer.recv_frame())["kind"] == Kind.ABORT  # the receiver says so
        await peer.send_frame(kv_header("gone", [5]), payload)
        nack = await peer.recv_frame()
        assert nack["kind"] == Kind.NACK and nack["code"] == "unknown_transfer"
        # the same connection still carries a good transfer to its commit
        p.rx.reserve("ok", [7], lease_s=30)
        await peer.send_frame({"kind": Kind.BEGIN, "transfer": "ok", "blocks": [7]})
        for layer in range(LAYOUT.num_layers):
            await peer.send_frame(kv_header("ok", [7], layer, layer + 1), payload)
        await peer.send_frame({"kind": Kind.COMMIT, "transfer": "ok", "token": 9,
                               "logprob": -0.25})
        ack = await peer.recv_frame()
        assert ack["kind"] == Kind.ACK and ack["transfer"] == "ok"
        assert isinstance(await p.rx.events.get(), Committed)
        for layer in range(LAYOUT.num_layers):
            got = p.dst[layer, :, 7].contiguous().view(-1).view(torch.uint8)
            assert bytes(got.numpy()) == payload
        peer.close()
        await finish(p)

    run(body())


def test_truncated_payload_then_reset_aborts_the_transfer() -> None:
    async def body() -> None:
        p = await make_pair("tcp", LAYOUT, dst_blocks=32)
        peer = await RawPeer.connect(p.endpoint)
        await peer.handshake(LAYOUT)
        p.rx.reserve("cut", [5, 6], lease_s=30)
        await peer.send_frame({"kind": Kind.BEGIN, "transfer": "cut", "blocks": [5, 6]})
        await peer.send_raw(peer.seal(kv_header("cut", [5, 6]))[0] + b"\0" * BLOCK_PAYLOAD)
        await p.rx.wait_until(lambda s: s.bound_transfers == 1)
        sock = peer.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.writer.transport.abort()  # RST mid-payload
        event = await p.rx.events.get()
        assert isinstance(event, Aborted) and event.code == "connection_lost"
        await finish(p)

    run(body())


def test_a_silent_peer_is_dropped_after_the_handshake_timeout() -> None:
    async def body() -> None:
        cfg = ReceiverConfig(TEST_SECRET, handshake_timeout_s=0.2)
        p = await make_pair("tcp", LAYOUT, rx_config=cfg)
        peer = await RawPeer.connect(p.endpoint)
        await peer.send_raw(PREFIX.pack(30))  # half a frame, then nothing
        await _expect_closed(peer)
        peer.close()
        await finish(p)

    run(body())


def test_wrong_proof_is_refused_with_auth() -> None:
    async def body() -> None:
        p = await make_pair("tcp", LAYOUT)
        peer = await RawPeer.connect(p.endpoint)
        with pytest.raises(AssertionError):  # our proof check of the receiver fails first
            await peer.handshake(LAYOUT, secret=b"w" * 32)
        await peer.send_frame({"kind": Kind.HELLO, "proof": b"\0" * 32,
                               "layout": LAYOUT.to_wire(), "fingerprint": LAYOUT.fingerprint})
        nack = await peer.recv_frame()  # sealed with a key a stranger cannot check
        assert nack["kind"] == Kind.NACK and nack["code"] == "auth"
        await _expect_closed(peer)
        peer.close()
        assert (await p.rx.wait_until(lambda s: s.refusals.get("auth") == 1)).connections == 0
        await finish(p)

    run(body())


def test_prefix_constant_is_four_bytes() -> None:
    assert PREFIX.size == 4
