"""The prefill role's own error: a KV push to a decode worker that failed.

    kv_transfer error during a push ──push_failed──> LayoutMismatch   (FAILED_PRECONDITION)
                                                  └> PushFailed       (UNAVAILABLE: unreachable,
                                                                       ABORTED: refused/aborted)

The router reads the code: UNAVAILABLE means another prefill worker may succeed. A push that
failed at its receiver (``receiver_failed``: the decode worker died, was drained or cannot be
reached) is UNAVAILABLE with the ``tandem-fault: receiver`` trailer: the decode leg is lost,
this worker is fine (tandem/router/handoff/blame.py).
"""

from __future__ import annotations

import grpc

from tandem.common.wire import RECEIVER_FAULT
from tandem.kv_transfer import KvTransferError, LayoutMismatchError
from tandem.worker.errors import (
    LayoutMismatch,
    WorkerError,
    receiver_failed,
    transfer_code,
    transfer_reason,
)


class PushFailed(WorkerError):
    """The KV push to the decode worker failed; ``code`` says whether a retry elsewhere may help
    (UNAVAILABLE: could not reach it) or the transfer was refused/aborted (ABORTED);
    ``receiver``: it failed at the decode worker, not here."""

    def __init__(self, message: str, code: grpc.StatusCode, receiver: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.receiver = receiver
        self.fault = RECEIVER_FAULT if receiver else None


def push_failed(exc: KvTransferError) -> WorkerError:
    """The worker-level error for a failed KV push."""
    if isinstance(exc, LayoutMismatchError):
        return LayoutMismatch(f"decode worker refused the KV layout: {exc}")
    if receiver_failed(exc):
        return PushFailed(f"KV push failed at the decode worker{transfer_reason(exc)}",
                          grpc.StatusCode.UNAVAILABLE, receiver=True)
    return PushFailed(f"KV push failed{transfer_reason(exc)}", transfer_code(exc))
