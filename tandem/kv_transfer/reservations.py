"""The receiver's bookkeeping: which destination blocks each transfer may write, and what it
has written. Pure Python (no torch, no asyncio) so it is tested in milliseconds.

    reserve -> RESERVED --bind(conn)--> BOUND --mark(layers, ids)...--> complete --> end
          \\___________________________________________________________________/
                              end(reason): commit, abort, expiry, release

A reservation leaves the table exactly once (``end``); its ``ended`` flag is what the receive
path checks after a frame's bytes have arrived and right before they are written into the
cache (the fence: nothing is written for an ended reservation).

The lease: ``expires_at`` is ``lease_s`` after ``reserve`` while RESERVED; ``bind`` (BEGIN)
and ``renew`` (every KV and KEEPALIVE frame) move it to ``now + window``, but never past the
bound transfer's ``deadline`` (its sender's own deadline, capped by the receiver):

    expires_at = min(now + window, deadline)        deadline = bound_at + min(ttl, max_s)

The reservation's record (which request, its prompt, who ends it) is the decode engine's
ledger (tandem/engine/core/remote_kv.py), keyed by the same transfer id; this table only tracks the
transfer's progress: which (layer, block) landed, which connection is bound, the lease. It
stays a separate object on purpose: it is read synchronously on the event loop before every
write into the cache, and sharing one mutable object with the engine thread would reopen the
race of blocks freed while a frame is being written into them.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from tandem.kv_transfer.errors import OutsideReservation, ReservationError, TransferRejected


@dataclass(slots=True, eq=False)
class Reservation:
    """Destination blocks reserved for one transfer, and its progress."""

    transfer_id: str
    block_ids: tuple[int, ...]
    position: dict[int, int]  # block id -> index in block_ids
    # by head window [start, stop) of the cache's heads: [num_layers * len(block_ids)], 1 once
    # (layer, block) of those heads has landed (one window, every head, but in a re-shard)
    written: dict[tuple[int, int], bytearray]
    missing: int  # (layer, block, head) triples not landed yet
    conn: int | None = None  # the connection whose BEGIN bound it
    conns: tuple[int, ...] = ()  # every connection carrying it: conn, then its joins
    stripes: int = 1  # how many connections it may span (its BEGIN says)
    # a re-sharded push: how many senders' head windows fill it (its BEGINs say), and which
    # window each connection carries
    parts: int = 1
    windows: dict[int, tuple[int, int]] = field(default_factory=dict)
    ended: bool = False
    expires_at: float = 0.0  # time.monotonic() instant the lease ends unless renewed
    deadline: float = math.inf  # once bound: no renewal reaches past this
    bound_at: float = 0.0  # time.monotonic() of its BEGIN
    first_kv_at: float = 0.0  # time.monotonic() of its first KV frame (the push's duration)
    adapter: str = ""  # the LoRA adapter identity its request runs under ("": the base model)

    def alive(self) -> bool:
        """False once the reservation has ended: nothing may be written for it any more."""
        return not self.ended

    @property
    def complete(self) -> bool:
        """Every (layer, block) has landed."""
        return self.missing == 0


class ReservationTable:
    """Live reservations by transfer id, plus a short memory of recent ends (for NACK codes)."""

    def __init__(self, num_blocks: int, num_layers: int, remember: int = 4096,
                 num_heads: int = 1) -> None:
        self.num_blocks = num_blocks
        self.num_layers = num_layers
        self.num_heads = num_heads  # the cache's KV heads (head windows are ranges of them)
        self._live: dict[str, Reservation] = {}
        self._held: set[int] = set()
        self._ended: OrderedDict[str, str] = OrderedDict()
        self._remember = remember

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, transfer_id: object) -> bool:
        return transfer_id in self._live

    @property
    def held_blocks(self) -> int:
        """Blocks covered by live reservations."""
        return len(self._held)

    @property
    def bound(self) -> int:
        """Reservations a connection is currently writing."""
        return sum(1 for r in self._live.values() if r.conn is not None)

    def reserve(self, transfer_id: str, block_ids: Sequence[int], *, now: float = 0.0,
                lease_s: float = math.inf, adapter: str = "") -> Reservation:
        """Register a reservation leased until ``now + lease_s``; ids must be unique, in range
        and not held by another. ``adapter``: the LoRA adapter identity the pushed KV must
        have been computed under (BEGIN says which; "": the base model)."""
        if not transfer_id or len(transfer_id) > 128:
            raise ReservationError("transfer id must be 1..128 characters")
        if transfer_id in self._live:
            raise ReservationError(f"transfer {transfer_id!r} is already reserved")
        ids = tuple(int(b) for b in block_ids)
        if not ids:
            raise ReservationError("a reservation needs at least one block")
        if len(set(ids)) != len(ids):
            raise ReservationError("duplicate block ids")
        if min(ids) < 0 or max(ids) >= self.num_blocks:
            raise ReservationError(f"block ids outside 0..{self.num_blocks - 1}")
        clash = self._held.intersection(ids)
        if clash:
            raise ReservationError(f"blocks {sorted(clash)[:8]} are held by another transfer")
        res = Reservation(transfer_id, ids, {b: i for i, b in enumerate(ids)}, {},
                          self.num_layers * len(ids) * self.num_heads, expires_at=now + lease_s,
                          adapter=adapter)
        self._live[transfer_id] = res
        self._held.update(ids)
        self._ended.pop(transfer_id, None)
        return res

    def ids(self) -> list[str]:
        """Ids of the live reservations."""
        return list(self._live)

    def get(self, transfer_id: str) -> Reservation | None:
        """The live reservation, or None."""
        return self._live.get(transfer_id)

    def ended_reason(self, transfer_id: str) -> str | None:
        """Why a recently ended reservation ended ("expired", "released", ...), else None."""
        return self._ended.get(transfer_id)

    def end(self, transfer_id: str, why: str) -> Reservation | None:
        """Remove a reservation (idempotent: None when it is not live)."""
        res = self._live.pop(transfer_id, None)
        if res is None:
            return None
        res.ended = True
        self._held.difference_update(res.block_ids)
        self._ended[transfer_id] = why
        while len(self._ended) > self._remember:
            self._ended.popitem(last=False)
        return res

    def bind(self, transfer_id: str, conn: int, block_ids: Sequence[int], *, now: float = 0.0,
             window: float = math.inf, ttl: float = math.inf, stripes: int = 1,
             adapter: str = "", parts: int = 1, heads: tuple[int, int] | None = None
             ) -> Reservation:
        """BEGIN: attach a reservation to the connection that will fill it, and renew its
        lease for ``window`` seconds; no renewal reaches past ``now + ttl``.

        A striped transfer (``stripes`` > 1) sends its BEGIN on each of its connections: the
        first to arrive binds it, the others join it (same blocks, same ``stripes``) until it
        spans ``stripes`` connections; whichever order they arrive in. KV computed under
        another LoRA adapter than the reservation's (``adapter``) is refused
        (``adapter_mismatch``): it would decode as garbage.

        A re-sharded push (``parts`` > 1, tandem/kv_transfer/reshard.py) is filled by that
        many senders, each over its own connection with its own window ``heads`` of the
        cache's KV heads (None: all of them): each joins with the same ``parts`` and a window
        no other part holds, until ``parts`` have joined."""
        res = self._live.get(transfer_id)
        if res is None:
            why = self._ended.get(transfer_id)
            code = "expired" if why == "expired" else "unknown_transfer"
            raise TransferRejected(transfer_id, f"no live reservation ({why or 'unknown'})", code)
        win = (0, self.num_heads) if heads is None else heads
        joins = res.conn is not None
        if joins and not (self._joins_stripes(res, conn, stripes, parts, win)
                          or self._joins_parts(res, conn, stripes, parts, win)):
            raise TransferRejected(transfer_id, "already bound to a connection", "busy")
        if adapter != res.adapter:
            raise TransferRejected(
                transfer_id, f"KV computed under adapter {adapter or '(base model)'!r}, the "
                f"reservation is for {res.adapter or '(base model)'!r}", "adapter_mismatch")
        if set(block_ids) != set(res.block_ids) or len(block_ids) != len(res.block_ids):
            raise TransferRejected(transfer_id, "BEGIN blocks differ from the reservation",
                                   "block_mismatch")
        res.conns += (conn,)
        res.windows[conn] = win
        res.written.setdefault(win, bytearray(self.num_layers * len(res.block_ids)))
        if joins:
            self.renew(res, now, window)
            return res
        res.conn = conn
        res.stripes = stripes
        res.parts = parts
        res.bound_at = now
        res.deadline = now + ttl
        self.renew(res, now, window)
        return res

    @staticmethod
    def _joins_stripes(res: Reservation, conn: int, stripes: int, parts: int,
                       win: tuple[int, int]) -> bool:
        """A stripe of the same part: same stripes, same window, room for it."""
        same = [c for c, w in res.windows.items() if w == win]
        return (stripes > 1 and stripes == res.stripes and parts == res.parts
                and conn not in res.conns and 0 < len(same) < stripes)

    @staticmethod
    def _joins_parts(res: Reservation, conn: int, stripes: int, parts: int,
                     win: tuple[int, int]) -> bool:
        """Another part of a re-sharded push: same parts, a window no part holds (disjoint
        from theirs), fewer than ``parts`` windows so far."""
        held = set(res.windows.values())
        return (parts > 1 and parts == res.parts and stripes == res.stripes
                and conn not in res.conns and len(held) < parts
                and all(win[1] <= a or b <= win[0] for a, b in held))

    @staticmethod
    def renew(res: Reservation, now: float, window: float) -> float:
        """Progress on a bound transfer: its lease now ends ``window`` from ``now``, or at its
        deadline if sooner. Returns the new ``expires_at``."""
        res.expires_at = min(now + window, res.deadline)
        return res.expires_at

    def bound_to(self, conn: int) -> list[Reservation]:
        """Live reservations bound to ``conn`` (as their first connection or a stripe)."""
        return [r for r in self._live.values() if conn in r.conns]

    def check_frame(self, res: Reservation, lo: int, hi: int, block_ids: Sequence[int]) -> None:
        """Raise ``OutsideReservation`` unless the frame's layers and ids are all reserved."""
        if not 0 <= lo < hi <= self.num_layers:
            raise OutsideReservation(f"layers [{lo}, {hi}) outside 0..{self.num_layers}")
        if not block_ids or len(set(block_ids)) != len(block_ids):
            raise OutsideReservation("empty or duplicate block ids in a KV frame")
        position = res.position
        for b in block_ids:
            if b not in position:
                raise OutsideReservation(f"block {b} is not reserved for {res.transfer_id!r}")

    def mark(self, res: Reservation, lo: int, hi: int, block_ids: Sequence[int],
             conn: int | None = None) -> None:
        """Record that ``block_ids`` of layers ``[lo, hi)`` landed, in the head window of
        connection ``conn`` (None: every head)."""
        n = len(res.block_ids)
        win = res.windows.get(conn, (0, self.num_heads)) if conn is not None \
            else (0, self.num_heads)
        written = res.written.setdefault(win, bytearray(self.num_layers * n))
        heads = win[1] - win[0]
        slots = [res.position[b] for b in block_ids]
        first = min(slots)
        if max(slots) - first == len(slots) - 1:  # (a permutation of) a run of positions: the
            ones = b"\x01" * len(slots)            # usual frame, marked a layer at a time
            for layer in range(lo, hi):
                a = layer * n + first
                res.missing -= written.count(0, a, a + len(slots)) * heads
                written[a:a + len(slots)] = ones
            return
        for layer in range(lo, hi):
            base = layer * n
            for p in slots:
                if not written[base + p]:
                    written[base + p] = 1
                    res.missing -= heads
