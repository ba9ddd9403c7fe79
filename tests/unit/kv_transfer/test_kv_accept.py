"""The KV port's accept path against strangers: connections wait in a small pre-authentication
pool (never in the member slots), the receiver says nothing about its cache before the
sender's proof verifies, and the accept loop outlives a connection whose setup fails."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from tandem.kv_transfer import Committed, ReceiverConfig
from tandem.kv_transfer.frames import PREFIX, Kind
from tandem.kv_transfer.handshake import SENDER_LABEL, proof
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
from tandem.kv_transfer.transport.base import Channel
from tandem.kv_transfer.transport.sockets import SocketChannel, SocketListener

LAYOUT = tiny_layout("float16", layers=2)


def test_strangers_holding_every_pre_auth_slot_do_not_keep_members_out() -> None:
    """Twice as many silent strangers as there are pre-auth slots, more than the member
    slots too, each free to wait a minute: a member still connects and transfers, and no
    stranger ever held a member slot."""

    async def body() -> None:
        cfg = ReceiverConfig(TEST_SECRET, max_connections=2, max_pending_handshakes=4,
                             handshake_timeout_s=60.0)
        p = await make_pair("tcp", LAYOUT, rx_config=cfg)
        strangers = []
        for _ in range(8):
            peer = await RawPeer.connect(p.endpoint)
            await peer.send_raw(PREFIX.pack(30))  # half a frame, then silence
            strangers.append(peer)
        stats = await p.rx.wait_until(lambda s: s.refusals.get("preauth_full", 0) == 4)
        assert stats.pending == 4 and stats.connections == 4  # none of them a member
        for i, dst in enumerate(([4, 5], [6, 7])):
            p.rx.reserve(f"m{i}", dst, lease_s=30)
            await p.tx.send(f"m{i}", p.endpoint, [1, 2], dst, first_token=1, logprob=0.0,
                            deadline=deadline())
            assert isinstance(await p.rx.events.get(), Committed)
            assert blocks_equal(p.src, [1, 2], p.dst, dst)
        closed = [await peer.closed_by_peer(timeout=0.5) for peer in strangers]
        assert sum(closed) >= 5, closed  # the 4 evicted at once, and one per member handshake
        stats = p.rx.stats()
        assert stats.pending <= 4 and stats.refusals.get("busy", 0) == 0
        for peer in strangers:
            peer.close()
        await finish(p)

    run(body())


def test_nothing_about_the_cache_goes_out_before_the_proof() -> None:
    """A stranger's first HELLO gets a nonce and the receiver's proof only (no layout, no
    fingerprint, no limits); a forged proof with a mismatched layout is refused as ``auth``,
    never as ``layout`` (which would tell the stranger what the layout is not)."""

    async def body() -> None:
        p = await make_pair("tcp", LAYOUT)
        peer = await RawPeer.connect(p.endpoint)
        hello = await peer.hello()
        assert hello["kind"] == Kind.HELLO
        assert set(hello) == {"kind", "version", "nonce", "proof"}, hello
        other = tiny_layout("float16", layers=5)
        fp = other.fingerprint
        forged = proof(b"not the secret, but long enough..", SENDER_LABEL, hello["nonce"],
                       b"n" * 16, fp)
        await peer.send_frame({"kind": Kind.HELLO, "proof": forged, "layout": other.to_wire(),
                               "fingerprint": fp})
        nack = await peer.recv_frame()
        assert nack["kind"] == Kind.NACK and nack["code"] == "auth", nack
        assert str(LAYOUT.num_layers) not in nack.get("reason", "")
        assert await peer.closed_by_peer()
        peer.close()
        stats = await p.rx.wait_until(lambda s: s.connections == 0)
        assert stats.refusals == {"auth": 1}
        await finish(p)

    run(body())


def test_the_accept_loop_survives_a_failing_channel_factory(
        caplog: pytest.LogCaptureFixture) -> None:
    """The first connection's setup raises: it is closed and logged, and the next one is
    served (the listener does not stop accepting for good)."""

    async def body() -> None:
        from tandem.kv_transfer.config import Limits
        from tandem.kv_transfer.frames import HeaderCodec

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        port = sock.getsockname()[1]
        served: asyncio.Queue[Channel] = asyncio.Queue()
        made = 0

        def make(conn: socket.socket, peer: str) -> Channel:
            nonlocal made
            made += 1
            if made == 1:
                raise OSError("setsockopt failed (injected)")
            return SocketChannel(conn, HeaderCodec(Limits()), 1 << 20, "tcp", peer)

        async def handler(channel: Channel) -> None:
            await served.put(channel)

        listener = SocketListener(sock, "tcp", f"127.0.0.1:{port}", make, handler)
        try:
            first_r, first_w = await asyncio.open_connection("127.0.0.1", port)
            assert await first_r.read() == b""  # closed by the receiver, not served
            first_w.close()
            _, second_w = await asyncio.open_connection("127.0.0.1", port)
            channel = await asyncio.wait_for(served.get(), 10)
            assert made == 2 and not channel.closed
            channel.close()
            second_w.close()
        finally:
            await listener.close()

    with caplog.at_level(logging.ERROR, logger="tandem.kv_transfer"):
        run(body())
    assert "injected" in caplog.text
