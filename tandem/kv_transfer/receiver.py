"""The decode side: reserve blocks, accept pushes into them, report how each transfer ended.

    decode worker                         Receiver                        senders
    reserve(t, ids, lease) ------------>  table[t] = RESERVED (lease_s to its BEGIN)
                                          listeners (tcp, shm, ...)  <--- connections
                                          InboundConnection per connection: frames -> blocks
                                          BEGIN / KV / KEEPALIVE renew a bound lease
    await events.get()  <---------------  Committed | Aborted | Expired
    release(t)  ------------------------> ended silently (+ ABORT to the sender if bound)

Every method runs on the event loop the receiver was started on.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from tandem.kv_transfer.blocks import KvBlocks
from tandem.kv_transfer.config import ReceiverConfig
from tandem.kv_transfer.endpoint import Endpoint, local_host_id
from tandem.kv_transfer.errors import ConfigError, PeerBusy
from tandem.kv_transfer.events import Aborted, Committed, Expired, TransferEvent
from tandem.kv_transfer.frames import abort
from tandem.kv_transfer.layout import KvLayout
from tandem.kv_transfer.receiver_conn import InboundConnection
from tandem.kv_transfer.reservations import Reservation, ReservationTable
from tandem.kv_transfer.reshard import GroupKv
from tandem.kv_transfer.transport import receiver_transports
from tandem.kv_transfer.transport.base import Channel, Listener, Transport

log = logging.getLogger(__name__)

EndWhy = Literal["committed", "aborted", "expired", "released"]


@dataclass(frozen=True, slots=True)
class ReceiverStats:
    """A snapshot of what the receiver holds; every test ends with the first four at zero."""

    reservations: int
    bound_transfers: int
    held_blocks: int
    buffered_bytes: int
    connections: int
    committed: int
    aborted: int
    expired: int
    bytes_received: int
    refusals: dict[str, int] = field(default_factory=dict)
    keepalives: int = 0  # KEEPALIVE frames that renewed a lease
    receiving: int = 0  # connections in the middle of a KV frame's payload right now
    pending: int = 0  # connections still in their handshake (counted in ``connections``)
    waiting_commits: int = 0  # striped transfers' COMMITs waiting for their last frames


class Receiver:
    """Accepts KV pushes into reserved blocks of ``kv`` (see the module docstring)."""

    def __init__(self, kv: torch.Tensor, layout: KvLayout, config: ReceiverConfig,
                 transports: Sequence[Transport] | None = None, *,
                 staged: bool | None = None, group: GroupKv | None = None,
                 rank: int = 0) -> None:
        """``group``, ``rank``: this cache as rank ``rank`` of a tensor-parallel group, which
        a re-sharded push's routes fill head window by head window (tandem/kv_transfer/
        reshard.py); a one-process cache is a group of one by default."""
        self.blocks = KvBlocks(kv, layout, staged=staged)
        self.layout = layout
        self.config = config
        self._transports = (list(transports) if transports is not None
                            else receiver_transports(config, self.blocks.is_cuda))
        self.group = group if group is not None or layout.tensor_parallel_size else \
            GroupKv.single(layout)
        self.rank = rank
        self.table = ReservationTable(self.blocks.num_blocks, layout.num_layers,
                                      num_heads=layout.num_kv_heads)
        self.events: asyncio.Queue[TransferEvent] = asyncio.Queue()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._landing: dict[str, asyncio.Future[None]] = {}  # striped COMMITs waiting
        self._conns: dict[int, InboundConnection] = {}  # authenticated: member slots
        self._pending: dict[int, InboundConnection] = {}  # in their handshake, oldest first
        self._conn_ids = itertools.count(1)
        self._listeners: list[Listener] = []
        self._endpoint: Endpoint | None = None
        self._change = asyncio.Event()
        self._counts: collections.Counter[str] = collections.Counter()
        self.refusals: collections.Counter[str] = collections.Counter()
        self.bytes_received = 0
        self.keepalives = 0

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> Endpoint:
        """Listen on every transport; returns the endpoint senders connect to."""
        if self._endpoint is not None:
            return self._endpoint
        if not self._transports:
            raise ConfigError("receiver has no transport to listen on")
        for transport in self._transports:
            self._listeners.append(await transport.listen(self._accept, self.blocks))
        self._endpoint = Endpoint(local_host_id(),
                                  tuple((lst.transport, lst.address) for lst in self._listeners))
        return self._endpoint

    @property
    def endpoint(self) -> Endpoint:
        """The endpoint returned by ``start``."""
        if self._endpoint is None:
            raise ConfigError("receiver not started")
        return self._endpoint

    async def close(self) -> None:
        """Stop listening, close every connection, and drop every reservation without events."""
        for listener in self._listeners:
            await listener.close()
        self._listeners.clear()
        conns = [*self._pending.values(), *self._conns.values()]
        for conn in conns:
            conn.close("receiver closing")
        await asyncio.gather(*(c.finished() for c in conns), return_exceptions=True)
        for tid in self.table.ids():
            self.release(tid, "receiver closing")

    def disconnect_all(self, reason: str = "disconnected by the receiver") -> None:
        """Close every sender connection now (their bound transfers end with ``Aborted``)."""
        for conn in [*self._pending.values(), *self._conns.values()]:
            conn.close(reason)

    # -- the decode worker's API --------------------------------------------------------------

    def reserve(self, transfer_id: str, block_ids: Sequence[int], lease_s: float,
                adapter: str = "") -> None:
        """Reserve destination blocks for ``transfer_id``: the lease ends ``lease_s`` seconds
        from now unless a BEGIN binds it; then progress renews it (see ``ReceiverConfig``).

        Raises ``ReservationError`` for a duplicate id or ids that are out of range, repeated,
        or held by another live reservation.
        """
        if not lease_s > 0:
            raise ConfigError("lease_s must be > 0")
        res = self.table.reserve(transfer_id, block_ids, now=time.monotonic(), lease_s=lease_s,
                                 adapter=adapter)
        self._arm(res)
        self._touch()

    def release(self, transfer_id: str, reason: str = "released by the decode worker") -> bool:
        """End a reservation without an event (idempotent; False when it was not live).

        A sender still pushing gets an ABORT; nothing more is written into its blocks, so they
        may be reused as soon as this returns.
        """
        return self._end(transfer_id, "released", code="released", reason=reason)

    def stats(self) -> ReceiverStats:
        """What the receiver holds right now."""
        buffered = sum(c.buffered_bytes for c in self._conns.values())
        return ReceiverStats(
            reservations=len(self.table), bound_transfers=self.table.bound,
            held_blocks=self.table.held_blocks, buffered_bytes=buffered,
            connections=len(self._conns) + len(self._pending),
            committed=self._counts["committed"],
            aborted=self._counts["aborted"], expired=self._counts["expired"],
            bytes_received=self.bytes_received, refusals=dict(self.refusals),
            keepalives=self.keepalives,
            receiving=sum(1 for c in self._conns.values() if c.receiving),
            pending=len(self._pending), waiting_commits=len(self._landing))

    async def wait_until(self, predicate: Callable[[ReceiverStats], bool],
                         timeout: float = 10.0) -> ReceiverStats:
        """Wait until ``predicate(stats())`` holds (e.g. all connections gone, for a drain)."""
        deadline = time.monotonic() + timeout
        while not predicate(stats := self.stats()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise asyncio.TimeoutError(f"receiver state never matched: {stats}")
            await asyncio.wait_for(self._change.wait(), remaining)
        return stats

    # -- internals used by InboundConnection ---------------------------------------------------

    def _touch(self) -> None:
        event, self._change = self._change, asyncio.Event()
        event.set()

    async def _accept(self, channel: Channel) -> None:
        """A new connection waits in the pre-authentication pool until its handshake proves
        it (``_admit`` moves it to a member slot); a full pool closes its longest waiting
        connection to make room (a member's handshake is one round trip: it never waits
        long enough to be the oldest while strangers keep arriving)."""
        conn_id = next(self._conn_ids)
        conn = InboundConnection(self, conn_id, channel)
        if len(self._pending) >= self.config.max_pending_handshakes:
            oldest_id = next(iter(self._pending))
            oldest = self._pending.pop(oldest_id)
            self.refusals["preauth_full"] += 1
            log.warning("pre-authentication pool full (%d): closing %s %s, waiting longest",
                        self.config.max_pending_handshakes, oldest.ch.transport, oldest.ch.peer)
            oldest.close("pre-authentication pool full")
        self._pending[conn_id] = conn
        self._touch()
        try:
            await conn.run()
        finally:
            self._pending.pop(conn_id, None)
            self._conns.pop(conn_id, None)
            self._touch()

    def _admit(self, conn: InboundConnection) -> None:
        """``conn`` proved itself: give it a member slot, or raise ``PeerBusy``."""
        if len(self._conns) >= self.config.max_connections:  # counted as a "busy" refusal
            log.warning("refusing %s %s: at max_connections=%d", conn.ch.transport,
                        conn.ch.peer, self.config.max_connections)
            raise PeerBusy("receiver at its connection limit")
        self._pending.pop(conn.id, None)
        self._conns[conn.id] = conn
        self._touch()

    def _arm(self, res: Reservation) -> None:
        """(Re)start the lease timer for ``res.expires_at``."""
        old = self._timers.pop(res.transfer_id, None)
        if old is not None:
            old.cancel()
        delay = max(0.0, res.expires_at - time.monotonic())
        self._timers[res.transfer_id] = asyncio.get_running_loop().call_later(
            delay, self._expire, res.transfer_id)

    async def wait_landed(self, res: Reservation) -> None:
        """Wait until every (layer, block) of ``res`` has landed or it has ended (a striped
        transfer's COMMIT may overtake its other connections' last frames)."""
        if res.complete or res.ended:
            return
        fut = self._landing.get(res.transfer_id)
        if fut is None:
            fut = self._landing[res.transfer_id] = asyncio.get_running_loop().create_future()
            self._touch()
        await asyncio.shield(fut)

    def _landed(self, res: Reservation) -> None:
        """``res`` is complete or ended: wake a COMMIT waiting for it."""
        fut = self._landing.pop(res.transfer_id, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _renew(self, res: Reservation) -> None:
        """Progress (KV, KEEPALIVE) on a bound transfer. Only moves ``expires_at`` later, so
        the armed timer stays: when it fires, ``_expire`` re-arms it for the rest."""
        self.table.renew(res, time.monotonic(), self.config.progress_timeout_s)

    def _expire(self, transfer_id: str) -> None:
        res = self.table.get(transfer_id)
        if res is None:
            return
        if res.expires_at > time.monotonic():  # renewed since the timer was armed
            self._arm(res)
            return
        if res.conn is None:
            reason = "lease expired before BEGIN"
        elif res.expires_at >= res.deadline:
            reason = "the sender's deadline passed"
        else:
            reason = f"no frame for {self.config.progress_timeout_s:g} s (sender silent)"
        self._end(transfer_id, "expired", code="expired", reason=reason)

    def _end(self, transfer_id: str, why: EndWhy, *, code: str, reason: str,
             by: Literal["sender", "receiver", "network"] = "receiver", token: int = 0,
             logprob: float = 0.0, forked: tuple[list[int], list[float]] = ([], [])) -> bool:
        """End a live reservation once: emit its event and, when the receiver ended it while a
        sender is bound, tell that sender."""
        res = self.table.end(transfer_id, why)
        if res is None:
            return False
        timer = self._timers.pop(transfer_id, None)
        if timer is not None:
            timer.cancel()
        self._landed(res)
        if why == "committed":
            seconds = time.monotonic() - (res.first_kv_at or res.bound_at)
            self.events.put_nowait(Committed(transfer_id, res.block_ids, token, logprob, seconds,
                                             tuple(forked[0]), tuple(forked[1])))
        elif why == "aborted":
            self.events.put_nowait(Aborted(transfer_id, res.block_ids, code, reason, by))
        elif why == "expired":
            self.events.put_nowait(Expired(transfer_id, res.block_ids))
        self._counts[why] += 1
        if by == "receiver" and why in ("expired", "released") and res.conn is not None:
            conn = self._conns.get(res.conn)
            if conn is not None:
                conn.send_soon(abort(transfer_id, reason))
        self._touch()
        return True
