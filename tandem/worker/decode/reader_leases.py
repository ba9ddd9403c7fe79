"""The attach lease: how long a decode stream with something to read waits for its reader.

The router calls Decode right after the prefill reply (or a live move's commit); a reader
that has not come by then never will (the router crashed in between, or went away while the
stream was suspended for a move). So a stream with no reader gets a timer:

    stream has output (first token, end, suspended) and no reader ──> lease(stream)
        ──> its Decode call comes ──> cancel(stream)
        ──> the lease runs out first ──> on_expiry(stream) (the worker aborts or forgets it)
    drain begins ──> every running lease is cut to ``drain_orphan_grace_s`` at most (a drain
        must end well inside a pod's termination grace period)

A lease already running goes on when asked again: it counts from the first token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tandem.worker.decode.streams import RequestStream


class ReaderLeases:
    """One timer per unread stream, by its sequence id (see the module docstring)."""

    def __init__(self, attach_lease_s: float, drain_orphan_grace_s: float,
                 on_expiry: Callable[[RequestStream], None]) -> None:
        """``on_expiry(stream)``: the lease of ``stream`` ran out with no reader (called
        once, after the lease is dropped)."""
        self._attach_s = attach_lease_s
        self._drain_s = drain_orphan_grace_s
        self._on_expiry = on_expiry
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._draining = False

    def __contains__(self, sequence_id: object) -> bool:
        return sequence_id in self._timers

    def lease(self, stream: RequestStream) -> None:
        """Start ``stream``'s lease unless it has a reader or a lease already."""
        if stream.attached or stream.request_id in self._timers:
            return
        ttl = min(self._attach_s, self._drain_s) if self._draining else self._attach_s
        self._timers[stream.request_id] = asyncio.get_running_loop().call_later(
            ttl, self._expire, stream)

    def cancel(self, stream: RequestStream) -> None:
        """Stop ``stream``'s lease (its reader came, or it is forgotten)."""
        timer = self._timers.pop(stream.request_id, None)
        if timer is not None:
            timer.cancel()

    def begin_drain(self, live: Callable[[str], RequestStream | None]) -> None:
        """Cut every lease to the drain's grace at most; from now on new ones get it too.
        ``live(sequence_id)``: the stream a lease is for, if the worker still keeps it."""
        self._draining = True
        loop = asyncio.get_running_loop()
        latest = loop.time() + self._drain_s
        for sequence_id, timer in list(self._timers.items()):
            stream = live(sequence_id)
            if stream is not None and timer.when() > latest:  # an orphan: shorten its wait
                timer.cancel()
                self._timers[sequence_id] = loop.call_at(latest, self._expire, stream)

    def _expire(self, stream: RequestStream) -> None:
        self._timers.pop(stream.request_id, None)
        self._on_expiry(stream)
