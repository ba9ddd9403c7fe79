"""Per-frame MACs after the handshake (tandem/kv_transfer/frame_mac.py): a frame tampered with,
replayed, reordered or reflected is refused before it is acted on, the connection closes and
whatever it had bound is freed; honest frames go through on every transport."""

from __future__ import annotations

import pytest
import torch

from tandem.kv_transfer import Aborted, Committed
from tandem.kv_transfer.frame_mac import FrameMac, session_keys
from tandem.kv_transfer.frames import Kind, encode_header
from tandem.kv_transfer.testing import (
    RawPeer,
    blocks_equal,
    deadline,
    finish,
    make_pair,
    run,
    tiny_layout,
)

LAYOUT = tiny_layout("bfloat16", layers=2)
PAYLOAD = LAYOUT.payload_bytes(1, 1)


def _kv(tid: str, block: int, layer: int) -> dict[str, object]:
    return {"kind": Kind.KV, "transfer": tid, "layers": [layer, layer + 1], "blocks": [block],
            "dtype": LAYOUT.kv_dtype, "shape": LAYOUT.payload_shape(1, 1), "nbytes": PAYLOAD}


def test_session_keys_differ_per_direction_and_per_connection() -> None:
    s = session_keys(b"k" * 32, b"a" * 16, b"b" * 16, "fp", sender=True)
    r = session_keys(b"k" * 32, b"a" * 16, b"b" * 16, "fp", sender=False)
    assert (s.send, s.recv) == (r.recv, r.send) and s.send != s.recv
    assert session_keys(b"k" * 32, b"a" * 16, b"c" * 16, "fp", sender=True).send != s.send
    assert session_keys(b"j" * 32, b"a" * 16, b"b" * 16, "fp", sender=True).send != s.send
    one, two = FrameMac(s.send), FrameMac(s.send)
    first = one.begin(b"frame")
    again = two.begin(b"frame")  # same key, same position: same tags
    assert again.header_tag == first.header_tag
    first.update(b"payload")
    again.update(b"payload")
    tag = first.payload_tag()
    assert again.payload_tag() == tag
    later = one.begin(b"frame")  # the next position: other tags
    later.update(b"payload")
    assert later.header_tag != first.header_tag and later.payload_tag() != tag


async def _bound_victim(peer: RawPeer, p_rx: object, tid: str, block: int) -> None:
    p_rx.reserve(tid, [block], lease_s=30)  # type: ignore[attr-defined]
    await peer.send_frame({"kind": Kind.BEGIN, "transfer": tid, "blocks": [block]})
    await p_rx.wait_until(lambda s: s.bound_transfers == 1)  # type: ignore[attr-defined]


@pytest.mark.parametrize("attack", ["payload", "header", "replay", "reorder", "reflect"])
def test_a_bad_frame_closes_the_connection_and_frees_what_it_bound(attack: str) -> None:
    async def body() -> None:
        p = await make_pair("tcp", LAYOUT, dst_blocks=8)
        peer = await RawPeer.connect(p.endpoint)
        await peer.handshake(LAYOUT)
        await _bound_victim(peer, p.rx, "victim", 3)
        payload = bytes(range(256)) * (PAYLOAD // 256) + b"\x01" * (PAYLOAD % 256)
        if attack == "payload":  # one payload byte changed on the way
            frame = bytearray(peer.frame_bytes(_kv("victim", 3, 0), payload))
            frame[-20] ^= 0x01
            await peer.send_raw(bytes(frame))
        elif attack == "header":  # the block id changed on the way: 3 -> 4 (outside)
            frame = peer.frame_bytes(_kv("victim", 3, 0), payload)
            old, new = b"\x91\x03", b"\x91\x04"  # msgpack: a 1-element list holding 3 / 4
            assert frame.count(old) == 1
            await peer.send_raw(frame.replace(old, new))
        elif attack == "replay":  # an honest frame, then the same bytes again
            frame = peer.frame_bytes({"kind": Kind.KEEPALIVE, "transfer": "victim"})
            await peer.send_raw(frame + frame)
        elif attack == "reorder":  # two honest frames, the second sent first
            first = peer.frame_bytes({"kind": Kind.KEEPALIVE, "transfer": "victim"})
            second = peer.frame_bytes(_kv("victim", 3, 0), payload)
            await peer.send_raw(second + first)
        else:  # a frame sealed with the receiver's own key, sent back to it
            assert peer.rx is not None
            head = encode_header({"kind": Kind.KEEPALIVE, "transfer": "victim"})
            await peer.send_raw(head + peer.rx.begin(head).header_tag)
        event = await p.rx.events.get()
        assert isinstance(event, Aborted) and event.code == "connection_lost", event
        assert await peer.closed_by_peer(), "the receiver kept a forged stream open"
        stats = await p.rx.wait_until(lambda s: s.connections == 0)
        assert stats.refusals.get("bad_mac") == 1, stats.refusals
        assert stats.bound_transfers == 0 and stats.held_blocks == 0
        assert not p.dst[:, :, 4].any(), "a forged header wrote outside its reservation"
        peer.close()
        await finish(p)

    run(body())


def test_honest_sealed_frames_commit_in_order() -> None:
    """The same hand-driven peer, frames in order: the transfer commits, bytes exact."""

    async def body() -> None:
        p = await make_pair("tcp", LAYOUT, dst_blocks=8)
        peer = await RawPeer.connect(p.endpoint)
        await peer.handshake(LAYOUT)
        await _bound_victim(peer, p.rx, "ok", 5)
        payloads = [bytes([layer + 1]) * PAYLOAD for layer in range(LAYOUT.num_layers)]
        for layer, payload in enumerate(payloads):
            await peer.send_frame(_kv("ok", 5, layer), payload)
        await peer.send_frame({"kind": Kind.COMMIT, "transfer": "ok", "token": 3,
                               "logprob": -0.5})
        ack = await peer.recv_frame()
        assert ack["kind"] == Kind.ACK and ack["transfer"] == "ok"
        assert isinstance(await p.rx.events.get(), Committed)
        for layer, payload in enumerate(payloads):
            got = p.dst[layer, :, 5].contiguous().view(-1).view(torch.uint8)
            assert bytes(got.numpy()) == payload
        peer.close()
        await finish(p)

    run(body())


@pytest.mark.parametrize("kind", ["fake", "tcp", "shm"])
def test_transfers_commit_over_sealed_channels(kind: str) -> None:
    async def body() -> None:
        p = await make_pair(kind, LAYOUT, dst_blocks=8)
        for i, dst in enumerate(([1, 2], [3, 4], [5, 6])):
            p.rx.reserve(f"t{i}", dst, lease_s=30)
            await p.tx.send(f"t{i}", p.endpoint, [1, 2], dst, first_token=i, logprob=0.0,
                            deadline=deadline())
            assert isinstance(await p.rx.events.get(), Committed)
            assert blocks_equal(p.src, [1, 2], p.dst, dst)
        await finish(p)

    run(body())
