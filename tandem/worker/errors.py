"""Typed errors of the worker processes, and the one place they become gRPC status codes.

Inside, logic classes raise typed errors (their own, the engine's, kv_transfer's); at the edge
``grpc_status`` maps each to a status code with a reason. Both roles use this module; a role's
own errors subclass ``WorkerError`` (``tandem.worker.prefill.errors.PushFailed``).

    InvalidRequestError  -> INVALID_ARGUMENT      OutOfBlocksError      -> RESOURCE_EXHAUSTED
                                                  GrammarBusyError      -> RESOURCE_EXHAUSTED
                                                    (+ tandem-busy: grammar)
    Draining             -> UNAVAILABLE           UnknownRequest        -> NOT_FOUND
    WrongState           -> FAILED_PRECONDITION   LayoutMismatch        -> FAILED_PRECONDITION
    TransferEnded        -> ABORTED               EngineDeadError       -> UNAVAILABLE
    KvTransferError      -> UNAVAILABLE (peer unreachable) | FAILED_PRECONDITION (layout)
                            | ABORTED (refused or aborted)

An error that is not the worker's own says whose it is in the ``tandem-fault`` trailer
(``WorkerError.fault``, tandem/common/wire.py): a prefill worker whose push failed because
its receiver died, was drained or cannot be reached (``receiver_failed``) sends "receiver",
so the router moves the leg to another decode worker and keeps this one in its pool
(tandem/router/handoff/blame.py). A request whose grammar is still compiling
(``GrammarBusyError``) is RESOURCE_EXHAUSTED with the ``tandem-busy: grammar`` trailer, so the
router tells its client why (the worker has room; the grammar is not ready).
"""

from __future__ import annotations

import grpc

from tandem.common.wire import BUSY_KEY, FAULT_KEY, GRAMMAR_BUSY, RETRY_AFTER_KEY
from tandem.engine.async_engine import EngineDeadError
from tandem.engine.errors import GrammarBusyError, InvalidRequestError, OutOfBlocksError
from tandem.kv_transfer import (
    ChannelClosed,
    ConnectionLost,
    HandshakeError,
    KvTransferError,
    LayoutMismatchError,
    NoRouteError,
    PeerBusy,
    TransferAborted,
    TransferFailed,
    TransferRejected,
)


class WorkerError(Exception):
    """Base class of every error a worker raises on purpose. ``fault``: whose failure it is
    when not this worker's (the ``tandem-fault`` trailer's value), else None."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    fault: str | None = None


class Draining(WorkerError):
    """The worker is shutting down and takes no new work."""

    code = grpc.StatusCode.UNAVAILABLE

    def __init__(self) -> None:
        super().__init__("draining: this worker takes no new work")


class BadRequest(WorkerError):
    """A worker-level check on a request failed (the engine's own checks raise
    ``InvalidRequestError``); ``field`` names the culprit."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class UnknownRequest(WorkerError):
    """No reservation or stream exists for the request id."""

    code = grpc.StatusCode.NOT_FOUND

    def __init__(self, request_id: str) -> None:
        super().__init__(f"unknown request {request_id!r}")


class WrongState(WorkerError):
    """The request exists but cannot do that now (e.g. a second Decode on one stream)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class LayoutMismatch(WorkerError):
    """The decode worker's KV layout is not this engine's: blocks are not interchangeable."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class AdapterMismatch(WorkerError):
    """The decode worker's LoRA adapter for the request is not this worker's (another name or
    other bytes): KV computed here would decode as garbage there."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class TransferEnded(WorkerError):
    """The request's KV never arrived (transfer aborted, lease expired) or it was aborted."""

    code = grpc.StatusCode.ABORTED


def transfer_code(exc: KvTransferError) -> grpc.StatusCode:
    """Whether a retry elsewhere may help (UNAVAILABLE: the peer could not be reached) or the
    transfer was refused or aborted (ABORTED)."""
    unreachable = isinstance(exc, (ConnectionLost, NoRouteError, HandshakeError, OSError))
    return grpc.StatusCode.UNAVAILABLE if unreachable else grpc.StatusCode.ABORTED


def receiver_failed(exc: KvTransferError) -> bool:
    """Whether a push failed at its receiver: the decode worker could not be reached or
    went away mid-push (dead, partitioned, at its connection limit), or ended the
    reservation on its side (aborted, drained, lease expired, restarted); not a refusal of
    what was sent (layout, checksum, authentication, a bad frame), which is the sender's
    problem as much as the receiver's."""
    if isinstance(exc, (ConnectionLost, ChannelClosed, NoRouteError, PeerBusy)):
        return True
    if isinstance(exc, TransferAborted):
        return exc.by == "receiver"
    if isinstance(exc, TransferRejected):
        return exc.code in ("expired", "unknown_transfer")
    return False


def transfer_reason(exc: KvTransferError) -> str:
    """What went wrong, with the peer's NACK code when it sent one."""
    if isinstance(exc, TransferFailed):
        return f" ({exc.code}): {exc.reason}"
    return f": {exc}"


def grpc_status(exc: BaseException) -> tuple[grpc.StatusCode, str] | None:
    """The status code and reason for a typed error, or None for anything else (a bug)."""
    if isinstance(exc, WorkerError):
        return exc.code, str(exc)
    if isinstance(exc, InvalidRequestError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, OutOfBlocksError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, f"KV cache full: {exc}"
    if isinstance(exc, GrammarBusyError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
    if isinstance(exc, EngineDeadError):
        return grpc.StatusCode.UNAVAILABLE, f"engine stopped: {exc}"
    if isinstance(exc, LayoutMismatchError):
        return grpc.StatusCode.FAILED_PRECONDITION, f"KV layout refused: {exc}"
    if isinstance(exc, KvTransferError):
        return transfer_code(exc), f"KV transfer failed{transfer_reason(exc)}"
    return None


# A full KV cache frees blocks as running requests finish; a few decode steps is the soonest
# a retry can succeed, so that is the hint.
FULL_RETRY_AFTER_MS = 250
# A grammar still compiling after the request's wait is a long compile (seconds, within its
# budget) or a queue of them: a retry much sooner than a second would only queue again.
GRAMMAR_RETRY_AFTER_MS = 1_000


async def abort_with_status(context: grpc.aio.ServicerContext, exc: Exception) -> None:
    """End the RPC with the status of a typed error; re-raise anything else (gRPC reports it
    as INTERNAL and logs the traceback: bugs are never silenced). RESOURCE_EXHAUSTED carries
    a ``retry-after-ms`` hint in the trailing metadata (and ``tandem-busy: grammar`` when the
    request's grammar is still compiling), an error that is not this worker's the
    ``tandem-fault`` trailer."""
    mapped = grpc_status(exc)
    if mapped is None:
        raise exc
    trailers: list[tuple[str, str]] = []
    if isinstance(exc, GrammarBusyError):
        trailers += [(RETRY_AFTER_KEY, str(GRAMMAR_RETRY_AFTER_MS)), (BUSY_KEY, GRAMMAR_BUSY)]
    elif mapped[0] == grpc.StatusCode.RESOURCE_EXHAUSTED:
        trailers.append((RETRY_AFTER_KEY, str(FULL_RETRY_AFTER_MS)))
    if isinstance(exc, WorkerError) and exc.fault is not None:
        trailers.append((FAULT_KEY, exc.fault))
    if trailers:
        context.set_trailing_metadata(tuple(trailers))
    await context.abort(*mapped)
