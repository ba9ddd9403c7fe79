"""Whose failure a failed push is: the receiver's (the decode worker died, was drained or
cannot be reached: the router moves the leg) or the prefill worker's own."""

from __future__ import annotations

import time

import grpc
import pytest

from tandem.common.wire import RECEIVER_FAULT
from tandem.kv_transfer import (
    AuthenticationError,
    ChecksumMismatch,
    ConnectionLost,
    DeadlineExceeded,
    KvTransferError,
    LayoutMismatchError,
    NoRouteError,
    PeerBusy,
    TransferAborted,
    TransferRejected,
)
from tandem.worker.errors import LayoutMismatch, receiver_failed
from tandem.worker.prefill.errors import PushFailed, push_failed
from tandem.worker.prefill.push import source_blocks
from tandem.worker.prefill.service import _out_of_time


@pytest.mark.parametrize(("exc", "receiver"), [
    (ConnectionLost("t", "cannot connect: refused"), True),  # dead, or never there
    (NoRouteError("no transport reaches it"), True),
    (PeerBusy("at its connection limit"), True),
    (TransferAborted("t", "request aborted", by="receiver"), True),  # drained, aborted there
    (TransferRejected("t", "expired: lease", "expired"), True),
    (TransferRejected("t", "unknown_transfer: restarted", "unknown_transfer"), True),
    (TransferAborted("t", "gave up", by="sender"), False),
    (TransferRejected("t", "block_mismatch: x", "block_mismatch"), False),
    (ChecksumMismatch("t", "corrupted"), False),
    (AuthenticationError("proof did not verify"), False),
    (DeadlineExceeded("t", "deadline passed"), False),  # whose time ran out: _out_of_time
])
def test_a_push_failed_at_its_receiver_says_so(exc: KvTransferError, receiver: bool) -> None:
    assert receiver_failed(exc) is receiver
    err = push_failed(exc)
    assert isinstance(err, PushFailed)
    assert (err.fault == RECEIVER_FAULT) is receiver
    if receiver:
        assert err.code == grpc.StatusCode.UNAVAILABLE


def test_a_layout_refusal_is_no_ones_death() -> None:
    err = push_failed(LayoutMismatchError("layout"))
    assert isinstance(err, LayoutMismatch) and err.fault is None


def test_whose_time_ran_out() -> None:
    """A push that failed past its deadline: the caller's deadline; else the receiver, when
    the first token was ready within the first half of the time (the push then waited on
    it); else this worker, busy (its prefill queued for most of the time)."""
    late = PushFailed("KV push failed: deadline", grpc.StatusCode.ABORTED)
    t0 = time.monotonic() - 31.0  # the 30 s budget has passed
    assert _out_of_time(late, t0, 30.0, 1.0, callers=True).code == grpc.StatusCode.DEADLINE_EXCEEDED
    silent = _out_of_time(late, t0, 30.0, 1.0, callers=False)
    assert silent.code == grpc.StatusCode.UNAVAILABLE and silent.fault == RECEIVER_FAULT
    busy = _out_of_time(late, t0, 30.0, 25.0, callers=False)
    assert busy.code == grpc.StatusCode.RESOURCE_EXHAUSTED and busy.fault is None
    on_time = _out_of_time(late, time.monotonic(), 30.0, 1.0, callers=False)
    assert on_time is late  # failed before the deadline: what the transfer layer said


def test_the_push_never_reads_a_block_freed_behind_the_window() -> None:
    """The source blocks a push reads: those after the reservation's skipped ones; one this
    engine freed behind a sliding window (-1) fails the push instead of being read."""
    assert source_blocks([-1, -1, 7, 8, 9, 10], 2, 3) == [7, 8, 9]
    with pytest.raises(PushFailed) as err:
        source_blocks([-1, -1, 7, 8, 9], 1, 3)
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "freed block 1 behind the sliding window" in str(err.value)
