"""Admission control by cost: at most ``max_inflight`` sequences and ``max_tokens`` prompt
tokens run, ``max_queue`` more sequences wait in FIFO order, and the rest are refused with a
hint of when to retry.

    request cost (tandem/router/cost.py): k sequences, t prompt tokens
    RUN     nobody waits ahead, and running + cost fits both running budgets
    WAIT    the queue's sequences + k fit max_queue (the head runs as soon as it fits)
    REJECT  otherwise (429 / RESOURCE_EXHAUSTED, with a Retry-After)

A request that could never fit (more sequences or tokens than a running budget) is refused
outright as invalid, naming the bound, instead of waiting forever. The queue is FIFO: a large
request at its head holds back smaller ones behind it, so it is never starved.

``AdmissionLedger`` is the pure bookkeeping (unit-tested without an event loop);
``AdmissionGate`` puts asyncio futures on top of it so waiting requests sleep until their
cost frees. A closed gate (draining) refuses everything new.
"""

from __future__ import annotations

import asyncio
from collections import deque
from enum import Enum

from tandem.router.cost import Cost
from tandem.router.errors import DrainingError, InvalidRequestError, OverloadedError


class Decision(Enum):
    """What to do with a new request."""

    RUN = "run"
    WAIT = "wait"
    REJECT = "reject"


class AdmissionLedger:
    """Counts running and waiting sequences (and running prompt tokens) against their bounds.

    ``max_tokens`` 0 bounds no tokens. ``running`` and ``waiting`` are sequences (what the
    metrics export as requests running / waiting: a forked prompt is that many requests).
    """

    def __init__(self, max_inflight: int, max_queue: int, retry_after_ms: int,
                 max_tokens: int = 0) -> None:
        self.max_inflight = max_inflight
        self.max_queue = max_queue
        self.max_tokens = max_tokens
        self.base_retry_after_ms = retry_after_ms
        self.running = 0
        self.running_tokens = 0
        self.waiting = 0
        self.rejected = 0

    @property
    def budget(self) -> Cost:
        """The running budgets (what one request may never exceed)."""
        return Cost(self.max_inflight, self.max_tokens)

    def check(self, cost: Cost) -> None:
        """InvalidRequestError when ``cost`` could never run here (see the module docstring)."""
        over = cost.over(self.budget)
        if over is None:
            return
        if cost.sequences > self.max_inflight:
            field, flag = "n", "--max-inflight"
        else:
            field, flag = "prompt", "--max-inflight-tokens"
        raise InvalidRequestError(
            field, f"the request needs {over}: more than the router runs at once ({flag})")

    def fits(self, cost: Cost) -> bool:
        """Whether ``cost`` fits beside what runs now."""
        return (self.running + cost.sequences <= self.max_inflight
                and (not self.max_tokens
                     or self.running_tokens + cost.tokens <= self.max_tokens))

    def decide(self, cost: Cost) -> Decision:
        """RUN when ``cost`` fits (and nobody waits ahead), WAIT when the queue has room."""
        if self.waiting == 0 and self.fits(cost):
            return Decision.RUN
        if self.waiting + cost.sequences <= self.max_queue:
            return Decision.WAIT
        return Decision.REJECT

    def start(self, cost: Cost) -> None:
        """A request takes its share of the running budgets."""
        self.running += cost.sequences
        self.running_tokens += cost.tokens

    def enqueue(self, cost: Cost) -> None:
        """A request joins the wait queue."""
        self.waiting += cost.sequences

    def promote(self, cost: Cost) -> None:
        """The head of the wait queue starts running."""
        self.waiting -= cost.sequences
        self.start(cost)

    def abandon(self, cost: Cost) -> None:
        """A waiting request left the queue (its client went away)."""
        self.waiting -= cost.sequences

    def finish(self, cost: Cost) -> None:
        """A running request ended and gave its share back."""
        self.running -= cost.sequences
        self.running_tokens -= cost.tokens

    def retry_after_ms(self) -> int:
        """Suggested client back-off: the base, scaled by how many are queued per slot."""
        return int(self.base_retry_after_ms * (1 + self.waiting / self.max_inflight))

    def reject(self) -> OverloadedError:
        """Count a refusal and build its error."""
        self.rejected += 1
        return OverloadedError(
            f"router overloaded: {self.running} sequences running, {self.waiting} queued",
            self.retry_after_ms(),
        )


class AdmissionGate:
    """The ledger plus FIFO wake-ups: ``await enter(cost)`` ... ``leave(cost)``."""

    def __init__(self, ledger: AdmissionLedger) -> None:
        self.ledger = ledger
        self._waiters: deque[tuple[asyncio.Future[None], Cost]] = deque()
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

    async def enter(self, cost: Cost) -> None:
        """Take ``cost`` of the running budgets, waiting in line if need be; raises when
        refused (InvalidRequestError when it could never run)."""
        if self._closed:
            raise DrainingError("router is draining")
        self.ledger.check(cost)
        decision = self.ledger.decide(cost)
        if decision is Decision.REJECT:
            raise self.ledger.reject()
        if decision is Decision.RUN:
            self.ledger.start(cost)
            return
        self.ledger.enqueue(cost)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (waiter, cost)
        self._waiters.append(entry)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.leave(cost)  # promoted at the moment we were cancelled: hand it on
            else:
                if entry in self._waiters:  # else _promote already dropped it
                    self._waiters.remove(entry)
                    self.ledger.abandon(cost)
                self._promote()  # it may have held back smaller ones behind it
                self._notify_idle()
            raise

    def leave(self, cost: Cost) -> None:
        """Give back a running request's share, waking the waiters that now fit."""
        self.ledger.finish(cost)
        self._promote()
        self._notify_idle()

    async def wait_idle(self) -> None:
        """Return once nothing is running or waiting (for a drain)."""
        if self.idle:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle_waiters.append(waiter)
        await waiter

    def _promote(self) -> None:
        """Start waiters from the head of the queue for as long as the head fits."""
        while self._waiters:
            waiter, cost = self._waiters[0]
            if waiter.cancelled():  # its task has yet to unwind: its place is given up now
                self._waiters.popleft()
                self.ledger.abandon(cost)
                continue
            if not self.ledger.fits(cost):
                return
            self._waiters.popleft()
            self.ledger.promote(cost)
            waiter.set_result(None)

    def _notify_idle(self) -> None:
        if self.idle:
            waiters, self._idle_waiters = self._idle_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
