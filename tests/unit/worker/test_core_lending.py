"""tandem/worker/core_lending: the lease a decode worker takes on an idle prefill worker's cores
for one step, revoked before the prefill worker computes. The protocol's state machine runs on
a fake clock; the file's failure modes and a real two-process exchange run on the real file."""

from __future__ import annotations

import multiprocessing
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tandem.worker.core_lending import (
    BUSY,
    IDLE,
    SIZE,
    WANT,
    CoreBorrower,
    CoreLender,
    LeaseState,
    make_core_share_file,
)


class Clock:
    """A fake monotonic clock; ``sleep`` advances it and runs what the test scheduled then."""

    def __init__(self) -> None:
        self.now = 100.0
        self.at: list[tuple[float, object]] = []  # (time, callable) to run once reached
        self.sleeps = 0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps += 1
        self.now += s
        for when, job in [x for x in self.at if x[0] <= self.now]:
            self.at.remove((when, job))
            job()  # type: ignore[operator]


class Memory:
    """A lease store in memory (what the mapped file holds, without the file)."""

    def __init__(self) -> None:
        self.state = LeaseState()

    @contextmanager
    def locked(self) -> Iterator[LeaseState]:
        yield self.state


def test_the_state_machine_lends_only_while_idle_and_revokes_before_taking() -> None:
    s = LeaseState()
    assert s.try_borrow(now=0.0, hold_s=0.1) and s.lent_out(0.05)
    assert not s.lent_out(0.1)  # the lease ran out: a dead borrower holds nothing
    s.give_back()
    assert not s.lent_out(0.05)
    s.revoke()
    assert s.lender == WANT and not s.try_borrow(0.0, 0.1)  # nothing new after a revoke
    s.take()
    assert s.lender == BUSY and not s.try_borrow(0.0, 0.1)
    s.lend()
    assert s.lender == IDLE and s.try_borrow(0.0, 0.1)


def test_the_lender_waits_out_the_borrowed_step_and_no_longer() -> None:
    clock, store = Clock(), Memory()
    borrower = CoreBorrower(store, clock=clock)
    lender = CoreLender(store, clock=clock, sleep=clock.sleep)
    events: list[str] = []
    assert borrower.try_borrow(hold_s=0.2)
    events.append("borrowed step starts")
    clock.at.append((clock.now + 0.03, lambda: (events.append("borrowed step ends"),
                                                 borrower.give_back())))
    lender.set_busy(True)
    events.append("lender computes")
    assert events == ["borrowed step starts", "borrowed step ends", "lender computes"]
    assert 0.03 <= lender.waited_s < 0.031
    assert not borrower.try_borrow(0.2)  # nothing is lent while the lender computes
    lender.set_busy(False)
    assert borrower.try_borrow(0.2)


def test_a_borrower_that_dies_mid_step_holds_the_cores_only_until_its_lease_ends() -> None:
    clock, store = Clock(), Memory()
    borrower = CoreBorrower(store, clock=clock)
    lender = CoreLender(store, clock=clock, sleep=clock.sleep)
    assert borrower.try_borrow(hold_s=0.05)  # ... and never gives back
    lender.set_busy(True)
    assert 0.05 <= lender.waited_s < 0.051
    assert store.state.lender == BUSY


def test_an_idle_lender_does_not_wait() -> None:
    clock, store = Clock(), Memory()
    lender = CoreLender(store, clock=clock, sleep=clock.sleep)
    lender.set_busy(True)
    assert clock.sleeps == 0 and lender.waited_s == 0


def test_the_file_is_private_and_starts_lendable(tmp_path: Path) -> None:
    path = make_core_share_file(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.stat().st_size == SIZE
    assert CoreBorrower(path).lender_idle()
    with pytest.raises(FileExistsError):  # never reuses (or follows) a file already there
        make_core_share_file(tmp_path)


def _borrow_steps(path: str, steps: int, log: str, started: multiprocessing.synchronize.Event
                  ) -> None:
    """A borrower process: ``steps`` steps of ~20 ms, each borrowing when it can; logs each
    step's start and end, and whether it borrowed (one O_APPEND line each)."""
    import os
    import time

    borrower = CoreBorrower(path)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    for _ in range(steps):
        lent = borrower.try_borrow(hold_s=5.0)
        os.write(fd, f"decode-start {int(lent)}\n".encode())
        started.set()
        end = time.monotonic() + 0.02
        while time.monotonic() < end:  # a step's work
            pass
        os.write(fd, f"decode-end {int(lent)}\n".encode())
        if lent:
            borrower.give_back()
    os.close(fd)


def test_a_prefill_arriving_mid_step_gets_its_cores_back_after_that_step(tmp_path: Path) -> None:
    """Two processes on the real file: once the lender asks, the borrowed step in flight ends
    before the lender computes, and no step borrows until the lender is idle again (checked
    as the order of the two processes' events in one append-only log, not as times)."""
    import os
    import time

    path = make_core_share_file(tmp_path)
    log = tmp_path / "events"
    log.touch()
    ctx = multiprocessing.get_context("spawn")
    started = ctx.Event()
    proc = ctx.Process(target=_borrow_steps, args=(str(path), 30, str(log), started))
    lender = CoreLender(path)
    proc.start()
    try:
        assert started.wait(60)
        fd = os.open(log, os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"prefill-wants\n")
        lender.set_busy(True)
        os.write(fd, b"prefill-computes\n")
        # the lender computes until the borrower has started two steps meanwhile (on its
        # own cores: checked below)
        deadline = time.monotonic() + 60
        while log.read_text().split("prefill-computes\n", 1)[1].count("decode-start") < 2:
            assert time.monotonic() < deadline, "the borrower stopped stepping"
            time.sleep(0.005)
        os.write(fd, b"prefill-idle\n")
        lender.set_busy(False)
        os.close(fd)
        proc.join(60)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        lender.close()
    lines = log.read_text().splitlines()
    wants, computes, idle = (lines.index(e) for e in
                             ("prefill-wants", "prefill-computes", "prefill-idle"))
    # a borrowed step that was running when the lender asked ended before the lender computed
    open_step = None
    for line in lines[:wants]:
        if line.startswith("decode-start"):
            open_step = line
        elif line.startswith("decode-end"):
            open_step = None
    if open_step == "decode-start 1":
        assert "decode-end 1" in lines[wants:computes]
    # and between the ask and the lender going idle, no step started borrowed
    assert "decode-start 1" not in lines[wants:idle]
    assert any(line == "decode-start 1" for line in lines[:wants] + lines[idle:])


def test_a_missing_or_other_file_is_a_clear_error_and_left_alone(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot open core-share file .*nope"):
        CoreLender(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.touch()
    with pytest.raises(ValueError, match="is not a core-share file"):
        CoreBorrower(empty)
    other = tmp_path / "notes.txt"  # a file named by mistake is not written to
    other.write_text("keep me")
    with pytest.raises(ValueError, match="is not a core-share file"):
        CoreLender(other)
    assert other.read_text() == "keep me"
