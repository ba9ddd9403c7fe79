"""Cores two workers on one host share: a lease the decode worker takes on the prefill
worker's idle cores for one step at a time, and the prefill worker revokes before it computes.

``tandem local`` (and ``tandem up`` on one machine) runs both roles side by side: the prefill
worker gets every core for its bursts, the decode worker a share of them. Between bursts the
prefill worker's cores sit idle. With a core share the decode worker may run a step on every
core, but only under a lease, one step at a time::

    decode engine thread, per step           shared file (private, 16 bytes)    prefill engine thread
    ---------------------------------        ---------------------------------   ---------------------
    try_borrow(hold): lender IDLE?    --->   lender  IDLE | WANT | BUSY    <---  revoke(): WANT, then
      yes: borrower=1, until=now+hold        borrower 0 | 1                        wait while borrower=1
      run the step on every core             until    (monotonic seconds)          and now < until;
    give_back(): borrower=0                                                       then BUSY (compute)
                                                                                  lend(): IDLE

So a prefill that arrives while a borrowed decode step runs waits for that step to end (never
longer than the lease the borrower took: a decode worker that dies mid-step holds nothing), and
no borrowed step starts until the prefill worker is idle again. The cores are never run by both
workers' full teams at once, which is what made every OpenMP barrier wait on a descheduled
thread. Each transition happens under an exclusive ``flock`` on the file (a system call of a
microsecond or two per step), so the lender and the borrower never both see the other idle.
Whether a step borrows at all is the decode worker's own choice (tandem/engine/step_threads.py:
it borrows only while borrowed steps measure faster than its own).

The file is made by whoever starts both (``make_core_share_file``), private to the user. A
prefill worker that dies busy leaves the cores unlendable: the decode worker keeps its own
threads, which is what it had without the share.

The protocol's decisions are pure functions of the shared state and a clock (:class:`LeaseState`,
unit-tested with a fake clock); :class:`SharedLease` is that state in the mapped file.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

IDLE, WANT, BUSY = 0, 1, 2  # the lender's states: lendable, revoking, computing
_LAYOUT = struct.Struct("<BB6xd")  # lender, borrower, pad, lease end (monotonic seconds)
SIZE = _LAYOUT.size  # 16 bytes
POLL_S = 0.0002  # the lender's wait between looks at a borrowed step that has not ended


def make_core_share_file(folder: str | Path) -> Path:
    """A new core-share file (lender idle, nothing borrowed) in ``folder``, readable by this
    user only."""
    path = Path(folder) / "core-share"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, _LAYOUT.pack(IDLE, 0, 0.0))
    finally:
        os.close(fd)
    return path


@dataclass(slots=True)
class LeaseState:
    """The lease's three fields; the protocol's steps are its methods (pure: the caller
    supplies ``now`` and holds whatever lock makes a step atomic)."""

    lender: int = IDLE
    borrowing: bool = False
    until: float = 0.0  # the borrowed step's lease ends here (monotonic seconds)

    def try_borrow(self, now: float, hold_s: float) -> bool:
        """The borrower's step may run on the lender's cores until ``now + hold_s``: only
        while the lender is idle."""
        if self.lender != IDLE:
            return False
        self.borrowing, self.until = True, now + hold_s
        return True

    def give_back(self) -> None:
        """The borrowed step ended."""
        self.borrowing = False

    def revoke(self) -> None:
        """The lender wants its cores: no new borrowed step starts from here on."""
        self.lender = WANT

    def lent_out(self, now: float) -> bool:
        """Whether a borrowed step still holds the cores (its lease not run out)."""
        return self.borrowing and now < self.until

    def take(self) -> None:
        """The lender computes (after :meth:`revoke` and once nothing is lent out)."""
        self.lender = BUSY

    def lend(self) -> None:
        """The lender is idle: its cores may be borrowed."""
        self.lender = IDLE


class LeaseStore(Protocol):
    """Where the state lives: ``locked()`` yields it for one atomic step and writes it back."""

    def locked(self) -> AbstractContextManager[LeaseState]: ...


class SharedLease:
    """The lease in a mapped core-share file; each ``locked()`` holds ``flock`` on it."""

    def __init__(self, path: str | Path) -> None:
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError as exc:
            raise ValueError(f"cannot open core-share file {path}: {exc.strerror}") from exc
        try:
            if os.fstat(fd).st_size != SIZE:  # not some other file named by mistake
                raise ValueError(f"{path} is not a core-share file ({SIZE} bytes)")
            self._map = mmap.mmap(fd, SIZE)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    @contextmanager
    def locked(self) -> Iterator[LeaseState]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            lender, borrowing, until = _LAYOUT.unpack(self._map[:SIZE])
            state = LeaseState(lender, bool(borrowing), until)
            yield state
            self._map[:SIZE] = _LAYOUT.pack(state.lender, int(state.borrowing), state.until)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Unmap and close."""
        self._map.close()
        os.close(self._fd)


class CoreLender:
    """The prefill side: ``set_busy(True)`` before computing (revokes, then waits out a
    borrowed step), ``set_busy(False)`` when idle again. Called on the engine thread."""

    def __init__(self, store: LeaseStore | str | Path,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._store = SharedLease(store) if isinstance(store, (str, Path)) else store
        self._clock, self._sleep = clock, sleep
        self.waited_s = 0.0  # seconds spent waiting for borrowed steps to end, in all
        self.set_busy(False)

    def set_busy(self, busy: bool) -> None:
        """The engine has work (True: take the cores back first) or has none left (False)."""
        if not busy:
            with self._store.locked() as state:
                state.lend()
            return
        started = self._clock()
        with self._store.locked() as state:
            state.revoke()
            lent = state.lent_out(started)
        while lent:  # one borrowed step at most: none starts after the revoke
            self._sleep(POLL_S)
            with self._store.locked() as state:
                lent = state.lent_out(self._clock())
        with self._store.locked() as state:
            state.take()
        self.waited_s += self._clock() - started

    def close(self) -> None:
        """Leave the cores lendable, then unmap."""
        self.set_busy(False)
        if isinstance(self._store, SharedLease):
            self._store.close()


class CoreBorrower:
    """The decode side: a lease on the lender's cores for one step at a time."""

    def __init__(self, store: LeaseStore | str | Path,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._store = SharedLease(store) if isinstance(store, (str, Path)) else store
        self._clock = clock

    def try_borrow(self, hold_s: float) -> bool:
        """Borrow the cores for a step expected to end within ``hold_s`` seconds (the lender
        waits no longer than that for it); False while the lender is not idle."""
        with self._store.locked() as state:
            return state.try_borrow(self._clock(), hold_s)

    def give_back(self) -> None:
        """The borrowed step ended."""
        with self._store.locked() as state:
            state.give_back()

    def lender_idle(self) -> bool:
        """Whether the lender is idle right now (a look, not a lease)."""
        with self._store.locked() as state:
            return state.lender == IDLE

    def close(self) -> None:
        """Unmap."""
        if isinstance(self._store, SharedLease):
            self._store.close()
