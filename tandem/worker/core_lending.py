"""Cores two workers on one host share: the prefill worker lends its cores to the decode worker
while it has nothing to compute.

``tandem local`` runs both roles on one machine: the prefill worker gets every core (its bursts
run at full speed) and the decode worker a quarter of them. Between bursts the prefill worker's
cores sit idle while a batch of decodes runs on one. With a core share, the decode worker takes
every core for a step while the prefill worker is idle (and the step has at least ``min_rows``
rows: default 1, every step; a larger value keeps small steps' cores for the router, the
client and the gRPC threads). Measured on 2 cores through HTTP, borrowing vs one thread: one
stream 8-10 vs 11-12 ms per token, 2-8 streams 1.2-1.3x the tokens/s, 32 streams even (an
earlier, noisier series had one stream at 15-25 ms on two threads; three alternating rounds
since did not)::

    prefill worker: AsyncEngine(on_busy=CoreLender(file).set_busy)   writes 1 busy / 0 idle
                                        [ a 1-byte file, mapped by both ]
    decode worker: runner.step_threads = BorrowedThreads(CoreBorrower(file), ...)
                   a step of >= min_rows rows, lender idle -> every core; else its own threads

The file is made by whoever starts both (``make_core_share_file``), private to the user. A
prefill worker that dies busy leaves the flag set: the decode worker keeps its own threads,
which is what it had without the share.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path

_BUSY, _IDLE = 1, 0


def make_core_share_file(folder: str | Path) -> Path:
    """A new core-share file (one byte: idle) in ``folder``, readable by this user only."""
    path = Path(folder) / "core-share"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, bytes([_IDLE]))
    finally:
        os.close(fd)
    return path


class _SharedByte:
    """One byte of a file, mapped shared (reads and writes are single loads and stores)."""

    def __init__(self, path: str | Path) -> None:
        try:
            with open(path, "r+b") as f:
                if os.fstat(f.fileno()).st_size != 1:  # not some other file named by mistake
                    raise ValueError(f"{path} is not a core-share file (one byte)")
                self._map = mmap.mmap(f.fileno(), 1)
        except OSError as exc:
            raise ValueError(f"cannot open core-share file {path}: {exc.strerror}") from exc

    def get(self) -> int:
        return self._map[0]

    def set(self, value: int) -> None:
        self._map[0] = value

    def close(self) -> None:
        self._map.close()


class CoreLender:
    """The prefill side: says whether it is computing (``set_busy``, from the engine thread)."""

    def __init__(self, path: str | Path) -> None:
        self._byte = _SharedByte(path)
        self._byte.set(_IDLE)

    def set_busy(self, busy: bool) -> None:
        """The engine has work (True) or has none left (False)."""
        self._byte.set(_BUSY if busy else _IDLE)

    def close(self) -> None:
        """Leave the cores lent (idle), then unmap."""
        self._byte.set(_IDLE)
        self._byte.close()


class CoreBorrower:
    """The decode side: reads whether the lender is idle."""

    def __init__(self, path: str | Path) -> None:
        self._byte = _SharedByte(path)

    def lender_idle(self) -> bool:
        """True while the prefill worker has nothing to compute."""
        return self._byte.get() == _IDLE

    def close(self) -> None:
        """Unmap."""
        self._byte.close()


@dataclass(slots=True)
class BorrowedThreads:
    """A decode step's thread count (the model runner's ``step_threads``): ``borrowed`` for a
    step of at least ``min_rows`` rows while the lender is idle, else ``own``.
    ``borrowed_steps`` counts the steps that borrowed (the decode worker's
    ``tandem_core_share_borrowed_steps_total``)."""

    borrower: CoreBorrower
    own: int
    borrowed: int
    min_rows: int = 1
    borrowed_steps: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.own < 1 or self.borrowed < self.own or self.min_rows < 1:
            raise ValueError("need 1 <= own <= borrowed threads and min_rows >= 1")

    def __call__(self, rows: int) -> int:
        """Threads for a step of ``rows`` query rows."""
        if rows >= self.min_rows and self.borrowed > self.own and self.borrower.lender_idle():
            self.borrowed_steps += 1  # the engine thread's alone; a scrape reads a whole int
            return self.borrowed
        return self.own
