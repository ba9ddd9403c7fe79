"""One client's share of the router: in-flight requests per connection and per API key.

Admission (tandem/router/admission.py) bounds what the whole router runs and queues; these bound
what one client holds of it, so a connection (or a key) that opens hundreds of streams gets
RESOURCE_EXHAUSTED / 429 for the excess at once, while everyone else still finds room::

    with limits.hold(connection, key):     # OverloadedError when either is at its bound
        ... admission, tokenize, handoff ...

A connection is what the edge calls its peer: gRPC's ``context.peer()`` (one channel, many
streams), HTTP's remote address and port (HTTP/1.1 runs one request at a time per
connection, so there the per-key bound is the one that bites). A key is the API key the
client presented, kept only as a SHA-256 digest; with no API keys configured there is none.
0 turns a bound off.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tandem.router.auth import BEARER
from tandem.router.errors import OverloadedError


@dataclass(frozen=True, slots=True)
class Slot:
    """What one request holds: its connection's count, and its key's when keys count."""

    connection: str
    key: str | None


class ClientLimits:
    """Counts in-flight requests by connection and by key against their bounds."""

    def __init__(self, per_connection: int, per_key: int, retry_after_ms: int) -> None:
        self.per_connection = per_connection
        self.per_key = per_key
        self.retry_after_ms = retry_after_ms
        self._by_connection: dict[str, int] = {}
        self._by_key: dict[str, int] = {}
        self.rejected = 0

    def enter(self, connection: str, key: str | None) -> Slot:
        """Count one request of ``connection`` (and ``key``); raises OverloadedError,
        counting nothing, when either is already at its bound. ``leave`` gives it back."""
        keyed = key if self.per_key > 0 else None
        if self.per_connection and self._by_connection.get(connection, 0) >= self.per_connection:
            raise self._reject(f"{self.per_connection} requests in flight on this connection")
        if keyed is not None and self._by_key.get(keyed, 0) >= self.per_key:
            raise self._reject(f"{self.per_key} requests in flight for this API key")
        _add(self._by_connection, connection, 1)
        if keyed is not None:
            _add(self._by_key, keyed, 1)
        return Slot(connection, keyed)

    def leave(self, slot: Slot) -> None:
        """A request counted by ``enter`` ended."""
        _add(self._by_connection, slot.connection, -1)
        if slot.key is not None:
            _add(self._by_key, slot.key, -1)

    @contextmanager
    def hold(self, connection: str, key: str | None) -> Iterator[None]:
        """``enter`` ... ``leave`` around a block."""
        slot = self.enter(connection, key)
        try:
            yield
        finally:
            self.leave(slot)

    def in_flight(self, connection: str) -> int:
        """Requests ``connection`` has in flight now."""
        return self._by_connection.get(connection, 0)

    def _reject(self, what: str) -> OverloadedError:
        self.rejected += 1
        return OverloadedError(f"client limit: {what}; retry when one ends", self.retry_after_ms)


def key_of(authorization: str | None) -> str | None:
    """The identity of the API key in an ``Authorization: Bearer <key>`` value (a digest, so
    no key is kept in memory), or None without one."""
    if not authorization or authorization[: len(BEARER)].lower() != BEARER:
        return None
    return hashlib.sha256(authorization[len(BEARER) :].strip().encode()).hexdigest()


def _add(counts: dict[str, int], name: str, delta: int) -> None:
    left = counts.get(name, 0) + delta
    if left > 0:
        counts[name] = left
    else:
        counts.pop(name, None)  # an idle client leaves nothing behind
