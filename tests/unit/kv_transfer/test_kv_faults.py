"""Faults inside one process: reset, corruption, leases, aborts, deadlines, limits, refusals.

Every test ends with both sides holding nothing (``finish``/``settle_and_check``).
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from tandem.kv_transfer import (
    Aborted,
    AuthenticationError,
    Committed,
    ConnectionLost,
    DeadlineExceeded,
    Expired,
    LayoutMismatchError,
    PeerBusy,
    ReceiverConfig,
    ReservationError,
    Sender,
    SenderConfig,
    TransferAborted,
    TransferFailed,
    TransferRejected,
)
from tandem.kv_transfer.testing import (
    TEST_SECRET,
    deadline,
    finish,
    make_pair,
    random_cache,
    run,
    settle_and_check,
    tiny_layout,
)

LAYOUT = tiny_layout("float16", layers=4)
SRC, DST = [1, 2, 3], [4, 5, 6]
# A lease (or a sender's deadline, or a progress timeout) meant to run out mid-transfer: long
# enough for the test to open the transfer and push its first layer on a loaded machine
# (milliseconds of work), short enough not to drag.
SHORT_LEASE_S = 2.0


def test_connection_reset_mid_transfer_aborts_both_sides() -> None:
    async def body() -> None:
        p = await make_pair("fake", LAYOUT)
        p.rx.reserve("t", DST, lease_s=30)
        t = await p.tx.open("t", p.endpoint, SRC, DST, deadline())
        await t.send_layers(0, 1)
        assert p.network is not None
        p.network.links[-1].reset()
        with pytest.raises(ConnectionLost):
            await t.commit(1, 0.0)
        event = await p.rx.events.get()
        assert isinstance(event, Aborted) and event.code == "connection_lost"
        await finish(p)

    run(body())


def test_receiver_disconnect_fails_the_sender() -> None:
    async def body() -> None:
        p = await make_pair("tcp", LAYOUT)
        p.rx.reserve("t", DST, lease_s=30)
        t = await p.tx.open("t", p.endpoint, SRC, DST, deadline())
        await t.send_layers(0, 2)
        p.rx.disconnect_all("test")
        assert isinstance(await t.wait_ended(), ConnectionLost)
        with pytest.raises(ConnectionLost):
            await t.commit(1, 0.0)
        event = await p.rx.events.get()
        assert isinstance(event, Aborted) and event.by == "network"
        await finish(p)

    run(body())


def test_flipped_payload_byte_fails_its_mac_and_closes_the_connection() -> None:
    """A payload byte changed on the way (frames carry MACs after the handshake): the
    connection closes, the transfer bound to it ends on both sides, its blocks are free; the
    next transfer (a new connection) commits."""

    async def body() -> None:
        p = await make_pair("fake", LAYOUT)
        p.rx.reserve("bad", DST, lease_s=30)
        p.rx.reserve("good", [7, 8, 9], lease_s=30)
        t = await p.tx.open("bad", p.endpoint, SRC, DST, deadline())
        assert p.network is not None
        p.network.links[-1].flip(300)  # past the KV header, inside its payload (3 KiB)
        t.push(0, LAYOUT.num_layers)
        with pytest.raises(ConnectionLost, match="bad_mac"):
            await t.commit(1, 0.0)
        event = await p.rx.events.get()
        assert isinstance(event, Aborted) and event.code == "connection_lost"
        assert p.rx.stats().refusals.get("bad_mac") == 1
        await p.tx.send("good", p.endpoint, SRC, [7, 8, 9], first_token=2, logprob=0.0,
                        deadline=deadline())
        assert isinstance(await p.rx.events.get(), Committed)
        await finish(p)

    run(body())



def test_lease_expiry_reports_expired_and_fails_the_sender() -> None:
    async def body() -> None:
        cfg = ReceiverConfig(TEST_SECRET, progress_timeout_s=SHORT_LEASE_S)
        p = await make_pair("fake", LAYOUT, rx_config=cfg)
        p.rx.reserve("slow", DST, lease_s=30)
        t = await p.tx.open("slow", p.endpoint, SRC, DST, deadline())
        await t.send_layers(0, 1)
        # its first layer landed (only a bound transfer's do); then the receiver hears nothing
        # more from the sender (its keepalives pile up in the stalled link): the lease ends
        await p.rx.wait_until(lambda s: s.bytes_received > 0)
        assert p.network is not None
        link = p.network.links[-1]
        link.stall()
        assert await p.rx.events.get() == Expired("slow", tuple(DST))
        failure = await t.wait_ended()  # the receiver told the sender
        assert isinstance(failure, TransferAborted) and failure.by == "receiver"
        with pytest.raises(TransferAborted):
            t.push(1, 2)
        link.resume()  # the stale keepalives are ignored, the connection carries on
        # a transfer that arrives after its lease is refused as expired
        p.rx.reserve("late", [10], lease_s=0.05)
        assert await p.rx.events.get() == Expired("late", (10,))
        t2 = await p.tx.open("late", p.endpoint, [1], [10], deadline())
        failure = await t2.wait_ended()
        assert isinstance(failure, TransferRejected) and failure.code == "expired"
        with pytest.raises(TransferRejected):
            await t2.commit(0, 0.0)
        await finish(p)

    run(body())


def test_abort_from_the_sender() -> None:
    async def body() -> None:
        p = await make_pair("shm", LAYOUT)
        p.rx.reserve("t", DST, lease_s=30)
        t = await p.tx.open("t", p.endpoint, SRC, DST, deadline())
        t.push(0, 1)
        t.push(1, 2)
        await t.abort("client went away")
        event = await p.rx.events.get()
        assert isinstance(event, Aborted) and event.by == "sender"
        assert event.reason == "client went away"
        assert p.tx.stats().transfers == 0
        await p.rx.wait_until(lambda s: s.reservations == 0)
        await t.abort("again")  # idempotent
        await finish(p)

    run(body())


def test_release_from_the_receiver_aborts_the_sender() -> None:
    async def body() -> None:
        p = await make_pair("tcp", LAYOUT)
        p.rx.reserve("t", DST, lease_s=30)
        t = await p.tx.open("t", p.endpoint, SRC, DST, deadline())
        await t.send_layers(0, 1)
        assert p.rx.release("t") is True
        assert p.rx.release("t") is False  # idempotent
        assert p.rx.release("never-reserved") is False
        failure = await t.wait_ended()
        assert isinstance(failure, TransferAborted) and failure.by == "receiver"
        with pytest.raises(TransferAborted):
            await t.commit(1, 0.0)
        assert p.rx.events.empty()  # release emits no event
        await finish(p)

    run(body())


def test_commit_before_every_layer_arrived_is_refused() -> None:
    async def body() -> None:
        p = await make_pair("fake", LAYOUT)
        p.rx.reserve("t", DST, lease_s=30)
        t = await p.tx.open("t", p.endpoint, SRC, DST, deadline())
        await t.send_layers(0, 1)
        with pytest.raises(TransferRejected) as info:
            await t.commit(1, 0.0)
        assert info.value.code == "incomplete"
        event = await p.rx.events.get()
        assert isinstance(event, Aborted) and event.code == "incomplete"
        await finish(p)

    run(body())


def test_deadline_bounds_a_stalled_receiver() -> None:
    async def body() -> None:
        p = await make_pair("fake", LAYOUT)
        p.rx.reserve("t", DST, lease_s=30)
        t = await p.tx.open("t", p.endpoint, SRC, DST, deadline())
        await t.send_layers(0, LAYOUT.num_layers)
        assert p.network is not None
        link = p.network.links[-1]
        link.stall()  # the COMMIT never reaches the receiver
        # The deadline runs out only now, while the receiver is stalled (a short deadline set
        # at open could run out before the layers were even sent, on a loaded machine).
        t.deadline = time.monotonic() + 0.3
        with pytest.raises(DeadlineExceeded):
            await t.commit(1, 0.0)
        assert p.tx.stats().transfers == 0
        link.reset()
        event = await p.rx.events.get()
        assert isinstance(event, Aborted) and event.code == "connection_lost"
        await finish(p)

    run(body())


def test_receiver_close_mid_transfer_fails_the_sender() -> None:
    async def body() -> None:
        p = await make_pair("shm", LAYOUT)
        p.rx.reserve("t", DST, lease_s=30)
        t = await p.tx.open("t", p.endpoint, SRC, DST, deadline())
        await t.send_layers(0, 1)
        await p.rx.close()
        assert isinstance(await t.wait_ended(), ConnectionLost)
        await settle_and_check(p.rx, p.tx)

    run(body())


def test_connection_limit_refuses_with_peer_busy(caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        cfg = ReceiverConfig(TEST_SECRET, max_connections=1)
        p = await make_pair("tcp", LAYOUT, rx_config=cfg)
        p.rx.reserve("a", DST, lease_s=30)
        t = await p.tx.open("a", p.endpoint, SRC, DST, deadline())
        other = Sender(random_cache(LAYOUT, 16), LAYOUT, SenderConfig(TEST_SECRET),
                       list(p.tx._pool._transports))
        with pytest.raises(PeerBusy):
            await other.open("b", p.endpoint, [1], [7], deadline())
        assert p.rx.stats().refusals.get("busy") == 1
        t.push(0, LAYOUT.num_layers)
        await t.commit(1, 0.0)
        assert isinstance(await p.rx.events.get(), Committed)
        await other.close()
        assert other.stats().connections == 0
        await finish(p)

    with caplog.at_level(logging.WARNING, logger="kv_transfer"):
        run(body())
    assert "max_connections" in caplog.text


def test_active_transfer_limit_nacks_begin() -> None:
    async def body() -> None:
        cfg = ReceiverConfig(TEST_SECRET, max_active_transfers=1)
        p = await make_pair("fake", LAYOUT, rx_config=cfg)
        p.rx.reserve("a", DST, lease_s=30)
        p.rx.reserve("b", [7, 8, 9], lease_s=30)
        t1 = await p.tx.open("a", p.endpoint, SRC, DST, deadline())
        t2 = await p.tx.open("b", p.endpoint, SRC, [7, 8, 9], deadline())
        failure = await t2.wait_ended()
        assert isinstance(failure, TransferRejected) and failure.code == "busy"
        t1.push(0, LAYOUT.num_layers)
        await t1.commit(1, 0.0)
        assert isinstance(await p.rx.events.get(), Committed)
        p.rx.release("b")
        await finish(p)

    run(body())


def test_layout_mismatch_is_refused_on_both_sides(caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        p = await make_pair("tcp", LAYOUT)
        other = tiny_layout("float16", layers=4, head_dim=16)
        from tandem.kv_transfer.transport import TcpTransport

        cfg = SenderConfig(TEST_SECRET)
        tx = Sender(random_cache(other, 4), other, cfg, [TcpTransport(cfg.limits)])
        with pytest.raises(LayoutMismatchError, match="head_dim"):
            await tx.open("t", p.endpoint, [0], [1], deadline())
        stats = await p.rx.wait_until(lambda s: s.refusals.get("layout") == 1)
        assert stats.connections == 0
        await settle_and_check(p.rx, tx)
        await finish(p)

    with caplog.at_level(logging.WARNING, logger="kv_transfer"):
        run(body())
    assert "LayoutMismatchError" in caplog.text


def test_wrong_secret_is_refused() -> None:
    async def body() -> None:
        p = await make_pair("fake", LAYOUT)
        from tandem.kv_transfer.transport import FakeTransport

        assert p.network is not None
        tx = Sender(random_cache(LAYOUT, 4), LAYOUT, SenderConfig(b"x" * 32),
                    [FakeTransport(p.network)])
        with pytest.raises(AuthenticationError):
            await tx.open("t", p.endpoint, [0], [1], deadline())
        await settle_and_check(p.rx, tx)
        await finish(p)

    run(body())


def test_bad_local_calls_raise_typed_errors() -> None:
    async def body() -> None:
        p = await make_pair("fake", LAYOUT)
        p.rx.reserve("t", DST, lease_s=30)
        with pytest.raises(ReservationError):
            p.rx.reserve("t", [10], lease_s=30)  # duplicate id
        with pytest.raises(ReservationError):
            p.rx.reserve("u", [6, 10], lease_s=30)  # 6 is held by "t"
        with pytest.raises(ReservationError):
            p.rx.reserve("v", [99], lease_s=30)  # out of range
        with pytest.raises(ValueError):
            await p.tx.open("x", p.endpoint, [1, 2], [3], deadline())
        with pytest.raises(ValueError):
            await p.tx.open("x", p.endpoint, [99], [3], deadline())
        with pytest.raises(TransferFailed):
            await p.tx.open("x", p.endpoint, [1], [3], time.monotonic() - 1)
        p.rx.release("t")
        await finish(p)

    run(body())


def test_many_transfers_fail_and_succeed_side_by_side() -> None:
    """Aborts, expiries and commits interleaved on one connection leave nothing behind."""
    async def body() -> None:
        p = await make_pair("tcp", LAYOUT, src_blocks=32, dst_blocks=32)
        outcomes: dict[str, str] = {}

        async def one(i: int) -> None:
            tid = f"t{i}"
            p.rx.reserve(tid, [i], lease_s=30)
            # keepalives renew every lease, but never past its sender's deadline
            t = await p.tx.open(tid, p.endpoint, [i], [i],
                                deadline(SHORT_LEASE_S if i % 3 == 0 else 20))
            await t.send_layers(0, 1)
            if i % 3 == 0:
                await asyncio.wait_for(t.wait_ended(), 30)  # the lease runs out
                outcomes[tid] = "expired"
            elif i % 3 == 1:
                await t.abort("nope")
                outcomes[tid] = "aborted"
            else:
                t.push(1, LAYOUT.num_layers)
                await t.commit(i, 0.0)
                outcomes[tid] = "committed"

        await asyncio.gather(*(one(i) for i in range(12)))
        kinds = {Committed: "committed", Aborted: "aborted", Expired: "expired"}
        for _ in range(12):
            event = await p.rx.events.get()
            assert kinds[type(event)] == outcomes[event.transfer_id]
        await finish(p)

    run(body())
