"""The write fence: a KV frame whose bytes are still arriving when its reservation ends (released
by the decode worker, or expired) writes nothing into the blocks, which by then may belong to
another request; the connection stays in sync and carries the next transfer to its commit.

Every transport's receive path is covered (tcp and tls write straight into the blocks, fake
through a pipe, staged and shm_staged through a host buffer, shm through a segment slot). The
frame is held half-sent by a ``HandSender``; every step waits on a condition, none on a clock.
"""

from __future__ import annotations

import pytest
import torch

from tandem.kv_transfer import Aborted, Committed, Expired, Limits, ReceiverConfig, TlsConfig
from tandem.kv_transfer.frames import Header, Kind
from tandem.kv_transfer.testing import (
    TEST_SECRET,
    HandSender,
    Pair,
    finish,
    make_pair,
    run,
    tiny_layout,
)
from tandem.kv_transfer.transport import FakeTransport, ShmTransport, TcpTransport, Transport

LAYOUT = tiny_layout("float16", layers=2)
VICTIM, NEXT = [3, 4], [9]
SENTINEL, REUSED = 0xA5, 0x3C  # before the late frame; what the blocks' next owner wrote
KINDS = ("tcp", "tls", "fake", "staged", "shm", "shm_staged")


def _client(kind: str, p: Pair, tls: TlsConfig) -> Transport:
    if kind in ("fake", "staged"):
        assert p.network is not None
        return FakeTransport(p.network)
    if kind in ("tcp", "tls"):
        return TcpTransport(Limits(), tls=tls if kind == "tls" else None)
    return ShmTransport(Limits())


def _payload(layers: int, blocks: int, seed: int) -> bytes:
    n = LAYOUT.payload_bytes(layers, blocks)
    return torch.randint(0, 256, (n,), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(seed)).numpy().tobytes()


def _block_bytes(kv: torch.Tensor, ids: list[int]) -> torch.Tensor:
    return kv[:, :, ids].contiguous().view(torch.uint8)


async def _until_ack(peer: HandSender, transfer: str) -> list[Header]:
    """Frames the receiver sent up to the ACK of ``transfer``'s COMMIT (that ACK means every
    byte before the COMMIT on this connection has been handled)."""
    seen: list[Header] = []
    while True:
        header = await peer.recv()
        if header["kind"] == Kind.ACK and header.get("transfer") == transfer:
            return seen
        seen.append(header)


@pytest.mark.parametrize("end", ["release", "expire"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_frame_still_arriving_when_its_reservation_ends_writes_nothing(
        kind: str, end: str, tls_config: TlsConfig) -> None:
    async def body() -> None:
        # "expire": the held frame's header renewed the lease; the hand-driven sender then says
        # nothing, so the lease runs out after the (short) progress timeout.
        cfg = ReceiverConfig(TEST_SECRET, progress_timeout_s=0.2 if end == "expire" else 10.0)
        p = await make_pair(kind, LAYOUT, rx_config=cfg, tls=tls_config)
        p.dst.view(torch.uint8).fill_(SENTINEL)
        peer = await HandSender.connect(_client(kind, p, tls_config), p.endpoint, LAYOUT)
        late = _payload(1, len(VICTIM), seed=1)

        p.rx.reserve("victim", VICTIM, lease_s=30)
        await peer.send({"kind": Kind.BEGIN, "transfer": "victim", "blocks": VICTIM})
        rest = await peer.hold_kv("victim", VICTIM, 0, 1, late)
        if kind.startswith("shm"):
            # the payload sits in its slot; half the header is on the socket
            await p.rx.wait_until(lambda s: s.bound_transfers == 1)
        else:
            # the receiver has the header and waits for the payload's bytes
            await p.rx.wait_until(lambda s: s.receiving == 1)
        if end == "release":
            assert p.rx.release("victim")
        else:
            assert await p.rx.events.get() == Expired("victim", tuple(VICTIM))
        # The blocks are the decode worker's again: another request writes them at once.
        for b in VICTIM:
            p.dst.view(torch.uint8)[:, :, b].fill_(REUSED)
        await rest()  # the late bytes arrive

        # The stream is still in sync: a whole transfer on the same connection commits.
        good = _payload(LAYOUT.num_layers, len(NEXT), seed=2)
        p.rx.reserve("next", NEXT, lease_s=30)
        await peer.send({"kind": Kind.BEGIN, "transfer": "next", "blocks": NEXT})
        await peer.send_kv("next", NEXT, 0, LAYOUT.num_layers, good)
        await peer.send({"kind": Kind.COMMIT, "transfer": "next", "token": 3, "logprob": -0.5})
        before = await _until_ack(peer, "next")

        # The sender was told the victim ended (ABORT), its late frame was refused (NACK), and
        # nothing of it was written.
        code = "expired" if end == "expire" else "unknown_transfer"
        assert sorted((h["kind"], h["transfer"], h.get("code") or "") for h in before) == [
            (Kind.ABORT, "victim", ""), (Kind.NACK, "victim", code)]
        assert bool((_block_bytes(p.dst, VICTIM) == REUSED).all())
        assert bytes(_block_bytes(p.dst, NEXT).numpy()) == good
        event = await p.rx.events.get()
        assert isinstance(event, Committed) and event.transfer_id == "next"
        assert p.rx.events.empty()
        stats = p.rx.stats()
        assert (stats.connections, stats.receiving) == (1, 0)
        assert stats.bytes_received == len(good)  # the late frame never counted as landed
        peer.close()
        await finish(p)

    run(body())


def test_a_late_frame_never_lands_in_blocks_reserved_again_for_another_transfer() -> None:
    """The blocks freed by a release go straight to a new reservation; the old transfer's
    late frame (same block ids) is dropped, and the new one fills them."""
    async def body() -> None:
        p = await make_pair("tcp", LAYOUT)
        p.dst.view(torch.uint8).fill_(SENTINEL)
        peer = await HandSender.connect(TcpTransport(Limits()), p.endpoint, LAYOUT)
        p.rx.reserve("old", VICTIM, lease_s=30)
        await peer.send({"kind": Kind.BEGIN, "transfer": "old", "blocks": VICTIM})
        rest = await peer.hold_kv("old", VICTIM, 0, 1, _payload(1, len(VICTIM), seed=1))
        await p.rx.wait_until(lambda s: s.receiving == 1)
        p.rx.release("old")
        p.rx.reserve("new", VICTIM, lease_s=30)  # the same blocks, another request
        await rest()
        await peer.send({"kind": Kind.BEGIN, "transfer": "new", "blocks": VICTIM})
        await peer.send({"kind": Kind.KEEPALIVE, "transfer": "old"})  # ignored: ended
        await peer.send({"kind": Kind.COMMIT, "transfer": "new", "token": 1, "logprob": 0.0})
        replies = [await peer.recv() for _ in range(3)]
        assert sorted((h["kind"], h["transfer"], h.get("code") or "") for h in replies) == sorted([
            (Kind.ABORT, "old", ""),  # the release told the sender
            (Kind.NACK, "old", "unknown_transfer"),  # its late frame
            (Kind.NACK, "new", "incomplete")])  # the new owner's blocks got nothing of it
        assert bool((_block_bytes(p.dst, VICTIM) == SENTINEL).all())
        event = await p.rx.events.get()
        assert isinstance(event, Aborted) and event.code == "incomplete"
        peer.close()
        await finish(p)

    run(body())
