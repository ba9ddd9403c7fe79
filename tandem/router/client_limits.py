"""One client's share of the router, by cost: sequences and prompt tokens in flight per
connection and per API key.

Admission (tandem/router/admission.py) bounds what the whole router runs and queues; these bound
what one client holds of it (running or queued), so a connection (or a key) that opens
hundreds of streams, or sends one body of hundreds of sequences, gets RESOURCE_EXHAUSTED / 429
for the excess at once, while everyone else still finds room::

    with limits.hold(connection, key) as charge:   # one sequence: refused at once when full
        ... read and parse the body ...
        charge.grow(cost)                          # the request's whole cost (tandem/router/cost.py)
        ... admission, tokenize, handoff ...

A request is charged one sequence before its body is read (a client at its bound does not
get to upload it first), then its whole cost once parsed. A cost over a bound's whole size
could never be served and is refused as invalid (400 / INVALID_ARGUMENT), naming the flag.

A connection is what the edge calls its peer: gRPC's ``context.peer()`` (one channel, many
streams), HTTP's remote address and port (HTTP/1.1 runs one request at a time per
connection, so there the per-key bound is the one that bites). A key is the API key the
client presented, kept only as a SHA-256 digest; with no API keys configured there is none.
A 0 in a bound turns that unit off.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tandem.router.auth import BEARER
from tandem.router.cost import NOTHING, ONE, Cost
from tandem.router.errors import InvalidRequestError, OverloadedError


@dataclass(slots=True)
class Slot:
    """What one request holds: its connection's share, and its key's when keys count."""

    connection: str
    key: str | None
    cost: Cost


class ClientLimits:
    """Counts in-flight cost by connection and by key against their bounds."""

    def __init__(self, per_connection: Cost, per_key: Cost, retry_after_ms: int) -> None:
        self.per_connection = per_connection
        self.per_key = per_key
        self.retry_after_ms = retry_after_ms
        self._by_connection: dict[str, Cost] = {}
        self._by_key: dict[str, Cost] = {}
        self.rejected = 0

    @property
    def keys_count(self) -> bool:
        """Whether a per-key bound is set."""
        return self.per_key != NOTHING

    def enter(self, connection: str, key: str | None, cost: Cost = ONE) -> Slot:
        """Charge ``cost`` to ``connection`` (and ``key``); raises, charging nothing, when
        either cannot take it. ``leave`` gives it back."""
        slot = Slot(connection, key if self.keys_count else None, NOTHING)
        self.grow(slot, cost)
        return slot

    def grow(self, slot: Slot, cost: Cost) -> None:
        """Raise ``slot``'s charge to ``cost`` (its request's whole cost, now known);
        InvalidRequestError when a bound could never take it, OverloadedError when it cannot
        now; either way the slot keeps what it held."""
        extra = cost - slot.cost
        self._check(cost, self.per_connection, "per-connection")
        held = self._by_connection.get(slot.connection, NOTHING) + extra
        if not held.within(self.per_connection):
            raise self._reject(f"{_full(held, self.per_connection)} in flight on this connection")
        if slot.key is not None:
            self._check(cost, self.per_key, "per-key")
            held = self._by_key.get(slot.key, NOTHING) + extra
            if not held.within(self.per_key):
                raise self._reject(f"{_full(held, self.per_key)} in flight for this API key")
            _add(self._by_key, slot.key, extra)
        _add(self._by_connection, slot.connection, extra)
        slot.cost = cost

    def leave(self, slot: Slot) -> None:
        """A request charged by ``enter`` ended."""
        _add(self._by_connection, slot.connection, NOTHING - slot.cost)
        if slot.key is not None:
            _add(self._by_key, slot.key, NOTHING - slot.cost)
        slot.cost = NOTHING

    @contextmanager
    def hold(self, connection: str, key: str | None, cost: Cost = ONE) -> Iterator[Slot]:
        """``enter`` ... ``leave`` around a block (``grow`` the slot it yields)."""
        slot = self.enter(connection, key, cost)
        try:
            yield slot
        finally:
            self.leave(slot)

    def in_flight(self, connection: str) -> Cost:
        """What ``connection`` holds now."""
        return self._by_connection.get(connection, NOTHING)

    @staticmethod
    def _check(cost: Cost, bound: Cost, which: str) -> None:
        over = cost.over(bound)
        if over is None:
            return
        if bound.sequences and cost.sequences > bound.sequences:
            field, flag = "n", f"--max-inflight-{which}"
        else:
            field, flag = "prompt", f"--max-inflight-tokens-{which}"
        raise InvalidRequestError(
            field, f"the request needs {over}: more than one client may hold ({flag})")

    def _reject(self, what: str) -> OverloadedError:
        self.rejected += 1
        return OverloadedError(f"client limit: {what}; retry when one ends", self.retry_after_ms)


def key_of(authorization: str | None) -> str | None:
    """The identity of the API key in an ``Authorization: Bearer <key>`` value (a digest, so
    no key is kept in memory), or None without one."""
    if not authorization or authorization[: len(BEARER)].lower() != BEARER:
        return None
    return hashlib.sha256(authorization[len(BEARER) :].strip().encode()).hexdigest()


def _full(held: Cost, bound: Cost) -> str:
    """The bound ``held`` would break, in words."""
    if bound.sequences and held.sequences > bound.sequences:
        return f"{bound.sequences} sequences"
    return f"{bound.tokens} prompt tokens"


def _add(counts: dict[str, Cost], name: str, delta: Cost) -> None:
    left = counts.get(name, NOTHING) + delta
    if left.sequences > 0 or left.tokens > 0:
        counts[name] = left
    else:
        counts.pop(name, None)  # an idle client leaves nothing behind
