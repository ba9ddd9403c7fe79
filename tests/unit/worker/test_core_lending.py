"""tandem/worker/core_lending: the prefill worker's busy flag as the decode worker reads it, the
decode step's thread rule, and the files' failure modes."""

from __future__ import annotations

import multiprocessing
import stat
from pathlib import Path

import pytest

from tandem.worker.core_lending import (
    BorrowedThreads,
    CoreBorrower,
    CoreLender,
    make_core_share_file,
)


def test_the_file_is_private_and_starts_idle(tmp_path: Path) -> None:
    path = make_core_share_file(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes() == b"\x00"
    assert CoreBorrower(path).lender_idle()
    with pytest.raises(FileExistsError):  # never reuses (or follows) a file already there
        make_core_share_file(tmp_path)


def _lend_busy(path: str, ready: multiprocessing.synchronize.Event,
               release: multiprocessing.synchronize.Event) -> None:
    lender = CoreLender(path)
    lender.set_busy(True)
    ready.set()
    release.wait(30)
    lender.set_busy(False)


def test_the_borrower_sees_the_lenders_state_across_processes(tmp_path: Path) -> None:
    path = make_core_share_file(tmp_path)
    borrower = CoreBorrower(path)
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_lend_busy, args=(str(path), ready, release))
    proc.start()
    try:
        assert ready.wait(60)
        assert not borrower.lender_idle()
        release.set()
        proc.join(60)
        assert proc.exitcode == 0
        assert borrower.lender_idle()
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        borrower.close()


def test_a_closing_lender_leaves_its_cores_lent(tmp_path: Path) -> None:
    path = make_core_share_file(tmp_path)
    lender, borrower = CoreLender(path), CoreBorrower(path)
    lender.set_busy(True)
    assert not borrower.lender_idle()
    lender.close()
    assert borrower.lender_idle()


def test_a_step_borrows_only_when_big_enough_and_the_lender_is_idle(tmp_path: Path) -> None:
    path = make_core_share_file(tmp_path)
    lender = CoreLender(path)
    threads = BorrowedThreads(CoreBorrower(path), own=1, borrowed=4, min_rows=8)
    assert [threads(rows) for rows in (1, 7, 8, 512)] == [1, 1, 4, 4]
    lender.set_busy(True)
    assert [threads(rows) for rows in (1, 8, 512)] == [1, 1, 1]
    lender.set_busy(False)
    assert threads(8) == 4
    assert threads.borrowed_steps == 3  # what the decode worker's metric counts
    same = BorrowedThreads(CoreBorrower(path), own=2, borrowed=2)
    assert same(64) == 2


@pytest.mark.parametrize("own,borrowed,min_rows", [(0, 2, 8), (3, 2, 8), (1, 2, 0)])
def test_a_bad_thread_rule_is_refused(tmp_path: Path, own: int, borrowed: int,
                                      min_rows: int) -> None:
    borrower = CoreBorrower(make_core_share_file(tmp_path))
    with pytest.raises(ValueError):
        BorrowedThreads(borrower, own=own, borrowed=borrowed, min_rows=min_rows)


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
