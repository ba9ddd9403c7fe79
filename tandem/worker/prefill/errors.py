"""The prefill role's own error: a KV push to a decode worker that failed.

    kv_transfer error during a push ──push_failed──> LayoutMismatch   (FAILED_PRECONDITION)
                                                  └> PushFailed       (UNAVAILABLE: unreachable,
                                                                       ABORTED: refused/aborted)

The router reads the code: UNAVAILABLE means another prefill worker may succeed.
"""

from __future__ import annotations

import grpc

from tandem.kv_transfer import KvTransferError, LayoutMismatchError
from tandem.worker.errors import LayoutMismatch, WorkerError, transfer_code, transfer_reason


class PushFailed(WorkerError):
    """The KV push to the decode worker failed; ``code`` says whether a retry elsewhere may help
    (UNAVAILABLE: could not reach it) or the transfer was refused/aborted (ABORTED)."""

    def __init__(self, message: str, code: grpc.StatusCode) -> None:
        super().__init__(message)
        self.code = code


def push_failed(exc: KvTransferError) -> WorkerError:
    """The worker-level error for a failed KV push."""
    if isinstance(exc, LayoutMismatchError):
        return LayoutMismatch(f"decode worker refused the KV layout: {exc}")
    return PushFailed(f"KV push failed{transfer_reason(exc)}", transfer_code(exc))
