"""Admission control: at most ``max_inflight`` requests run, ``max_queue`` more wait in FIFO
order, and the rest are refused with a hint of when to retry.

``AdmissionLedger`` is the pure bookkeeping (unit-tested without an event loop);
``AdmissionGate`` puts asyncio futures on top of it so waiting requests sleep until a slot
frees. A closed gate (draining) refuses everything new.
"""

from __future__ import annotations

import asyncio
from collections import deque
from enum import Enum

from tandem.router.errors import DrainingError, OverloadedError


class Decision(Enum):
    """What to do with a new request."""

    RUN = "run"
    WAIT = "wait"
    REJECT = "reject"


class AdmissionLedger:
    """Counts running and waiting requests against their bounds."""

    def __init__(self, max_inflight: int, max_queue: int, retry_after_ms: int) -> None:
        self.max_inflight = max_inflight
        self.max_queue = max_queue
        self.base_retry_after_ms = retry_after_ms
        self.running = 0
        self.waiting = 0
        self.rejected = 0

    def decide(self) -> Decision:
        """RUN when a slot is free (and nobody waits ahead), WAIT when the queue has room."""
        if self.running < self.max_inflight and self.waiting == 0:
            return Decision.RUN
        if self.waiting < self.max_queue:
            return Decision.WAIT
        return Decision.REJECT

    def start(self) -> None:
        """A request takes a running slot."""
        self.running += 1

    def enqueue(self) -> None:
        """A request joins the wait queue."""
        self.waiting += 1

    def promote(self) -> None:
        """The head of the wait queue takes a running slot."""
        self.waiting -= 1
        self.running += 1

    def abandon(self) -> None:
        """A waiting request left the queue (its client went away)."""
        self.waiting -= 1

    def finish(self) -> bool:
        """A running request ended; True when a waiter should be promoted into its slot."""
        self.running -= 1
        return self.waiting > 0 and self.running < self.max_inflight

    def retry_after_ms(self) -> int:
        """Suggested client back-off: the base, scaled by how many are queued per slot."""
        return int(self.base_retry_after_ms * (1 + self.waiting / self.max_inflight))

    def reject(self) -> OverloadedError:
        """Count a refusal and build its error."""
        self.rejected += 1
        return OverloadedError(
            f"router overloaded: {self.running} running, {self.waiting} queued",
            self.retry_after_ms(),
        )


class AdmissionGate:
    """The ledger plus FIFO wake-ups: ``await enter()`` ... ``leave()``."""

    def __init__(self, ledger: AdmissionLedger) -> None:
        self.ledger = ledger
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._closed = False

    @property
    def idle(self) -> bool:
        """Nothing running or waiting."""
        return self.ledger.running == 0 and self.ledger.waiting == 0

    @property
    def closed(self) -> bool:
        """True once ``close`` was called (draining)."""
        return self._closed

    def close(self) -> None:
        """Refuse new requests from now on (draining); admitted and queued ones proceed."""
        self._closed = True

    async def enter(self) -> None:
        """Take a running slot, waiting in line if need be; raises when refused."""
        if self._closed:
            raise DrainingError("router is draining")
        decision = self.ledger.decide()
        if decision is Decision.REJECT:
            raise self.ledger.reject()
        if decision is Decision.RUN:
            self.ledger.start()
            return
        self.ledger.enqueue()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.leave()  # promoted at the moment we were cancelled: hand the slot on
            else:
                self._waiters.remove(waiter)
                self.ledger.abandon()
                self._notify_idle()
            raise

    def leave(self) -> None:
        """Give back a running slot, waking the next waiter if there is one."""
        if self.ledger.finish():
            self.ledger.promote()
            self._waiters.popleft().set_result(None)
        self._notify_idle()

    async def wait_idle(self) -> None:
        """Return once nothing is running or waiting (for a drain)."""
        if self.idle:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle_waiters.append(waiter)
        await waiter

    def _notify_idle(self) -> None:
        if self.idle:
            waiters, self._idle_waiters = self._idle_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
