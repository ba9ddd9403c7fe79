"""Leases renewed by transfer progress (docs/kv_transfer.md section 4): BEGIN, KV and KEEPALIVE
renew a bound transfer's lease; a silent sender is cut after the progress timeout; no renewal
reaches past the sender's deadline (or the receiver's max_transfer_s).

Waits are on conditions (events, receiver stats); the time that passes is a consequence of the
keepalive pacing, never an assertion.
"""

from __future__ import annotations

import asyncio
import contextlib
import math

import pytest

from tandem.kv_transfer import (
    Committed,
    Expired,
    Limits,
    ReceiverConfig,
    TransferAborted,
    TransferSpecError,
)
from tandem.kv_transfer.frames import Header, Kind
from tandem.kv_transfer.reservations import ReservationTable
from tandem.kv_transfer.testing import (
    TEST_SECRET,
    HandSender,
    blocks_equal,
    deadline,
    finish,
    make_pair,
    run,
    tiny_layout,
)
from tandem.kv_transfer.transport import TcpTransport

LAYOUT = tiny_layout("float16", layers=3)
SRC, DST = [1, 2], [5, 6]


def test_renewal_arithmetic_is_bounded_by_the_deadline() -> None:
    table = ReservationTable(num_blocks=10, num_layers=2)
    res = table.reserve("a", [1, 2], now=100.0, lease_s=1.0)
    assert res.expires_at == 101.0 and res.deadline == math.inf  # RESERVED: the lease alone
    table.bind("a", 7, [2, 1], now=100.5, window=2.0, ttl=3.0)  # BEGIN renews ...
    assert (res.bound_at, res.deadline, res.expires_at) == (100.5, 103.5, 102.5)
    assert table.renew(res, 101.0, 2.0) == 103.0  # ... and so does every frame
    assert table.renew(res, 102.0, 2.0) == 103.5  # never past the sender's deadline
    assert table.renew(res, 103.4, 2.0) == 103.5
    # A short deadline at BEGIN ends the lease sooner than the Reserve's lease would have.
    short = table.reserve("b", [3], now=0.0, lease_s=30.0)
    table.bind("b", 7, [3], now=1.0, window=10.0, ttl=0.25)
    assert short.expires_at == 1.25


@pytest.mark.parametrize("kind", ["fake", "tcp", "shm"])
def test_keepalives_carry_a_quiet_transfer_past_its_lease(kind: str) -> None:
    """Opened before its source blocks exist (a prefill still queued), the transfer is renewed
    by the connection's keepalives alone, well past its lease and the progress timeout."""
    async def body() -> None:
        cfg = ReceiverConfig(TEST_SECRET, progress_timeout_s=0.4)  # a KEEPALIVE every 0.1 s
        p = await make_pair(kind, LAYOUT, rx_config=cfg)
        p.rx.reserve("queued", DST, lease_s=0.2)
        t = await p.tx.open("queued", p.endpoint, None, DST, deadline(60))
        with pytest.raises(TransferSpecError):
            t.push(0, 1)  # no sources yet
        with pytest.raises(TransferSpecError):
            t.set_source([1, 2, 3])  # three sources for two destinations
        # Eight keepalives are at least 0.8 s after BEGIN: four leases, two progress timeouts.
        stats = await p.rx.wait_until(lambda s: s.keepalives >= 8)
        assert (stats.reservations, stats.bound_transfers, stats.expired) == (1, 1, 0)
        t.set_source(SRC)
        t.push(0, LAYOUT.num_layers)
        await t.commit(4, -0.5)
        event = await p.rx.events.get()
        assert isinstance(event, Committed) and event.first_token == 4
        assert blocks_equal(p.src, SRC, p.dst, DST)
        await finish(p)

    run(body())


def _abort_reason(frames: list[Header], transfer: str) -> str:
    (abort,) = [h for h in frames if h["kind"] == Kind.ABORT and h["transfer"] == transfer]
    return str(abort.get("reason", ""))


def test_a_bound_but_silent_sender_is_cut_after_the_progress_timeout() -> None:
    """Another connection's keepalives for the transfer renew nothing: it expires all the same
    (were they counted, it would live on and the test would time out)."""
    async def body() -> None:
        cfg = ReceiverConfig(TEST_SECRET, progress_timeout_s=0.3)
        p = await make_pair("tcp", LAYOUT, rx_config=cfg)
        silent = await HandSender.connect(TcpTransport(Limits()), p.endpoint, LAYOUT)
        other = await HandSender.connect(TcpTransport(Limits()), p.endpoint, LAYOUT)
        p.rx.reserve("t", DST, lease_s=30)
        await silent.send({"kind": Kind.BEGIN, "transfer": "t", "blocks": DST,
                           "ttl_ms": 60_000})

        async def meddle() -> None:
            while True:
                await other.send({"kind": Kind.KEEPALIVE, "transfer": "t"})
                await asyncio.sleep(0.05)  # pacing, not a wait for anything

        meddler = asyncio.get_running_loop().create_task(meddle())
        try:
            assert await p.rx.events.get() == Expired("t", tuple(DST))
        finally:
            meddler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await meddler
        assert "sender silent" in _abort_reason([await silent.recv()], "t")
        stats = p.rx.stats()
        assert (stats.keepalives, stats.reservations, stats.held_blocks) == (0, 0, 0)
        assert stats.connections == 2  # the transfer was cut, not the connections
        silent.close()
        other.close()
        await finish(p)

    run(body())


@pytest.mark.parametrize("bound", ["ttl", "max_transfer_s"])
def test_renewals_never_reach_past_the_senders_deadline(bound: str) -> None:
    """A sender that keeps sending keepalives still loses the transfer at the deadline it gave
    at BEGIN (or, giving none, at the receiver's max_transfer_s)."""
    async def body() -> None:
        cfg = ReceiverConfig(TEST_SECRET, progress_timeout_s=10.0,
                             max_transfer_s=0.3 if bound == "max_transfer_s" else 600.0)
        p = await make_pair("tcp", LAYOUT, rx_config=cfg)
        peer = await HandSender.connect(TcpTransport(Limits()), p.endpoint, LAYOUT)
        p.rx.reserve("t", DST, lease_s=30)
        begin: Header = {"kind": Kind.BEGIN, "transfer": "t", "blocks": DST}
        if bound == "ttl":
            begin["ttl_ms"] = 300
        await peer.send(begin)

        async def chatter() -> None:
            while True:
                await peer.send({"kind": Kind.KEEPALIVE, "transfer": "t"})
                await asyncio.sleep(0.02)  # pacing, not a wait for anything

        talker = asyncio.get_running_loop().create_task(chatter())
        try:
            assert await p.rx.events.get() == Expired("t", tuple(DST))
        finally:
            talker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await talker
        assert p.rx.stats().keepalives >= 1  # it was renewed, up to the deadline
        assert "deadline" in _abort_reason([await peer.recv()], "t")
        peer.close()
        await finish(p)

    run(body())


def test_a_real_sender_past_its_deadline_is_told_by_the_receiver() -> None:
    async def body() -> None:
        cfg = ReceiverConfig(TEST_SECRET, progress_timeout_s=0.4)
        p = await make_pair("fake", LAYOUT, rx_config=cfg)
        p.rx.reserve("t", DST, lease_s=30)
        t = await p.tx.open("t", p.endpoint, SRC, DST, deadline(1.0))
        await t.send_layers(0, 1)
        assert await p.rx.events.get() == Expired("t", tuple(DST))
        failure = await t.wait_ended()
        assert isinstance(failure, TransferAborted) and failure.by == "receiver"
        await finish(p)

    run(body())
