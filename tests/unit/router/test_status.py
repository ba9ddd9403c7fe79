"""Typed errors -> gRPC status at the edge: code, details, retry trailer."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tandem.common.wire import REQUEST_ID_KEY, RETRY_AFTER_KEY
from tandem.router.errors import (
    DeadlineError,
    DrainingError,
    InvalidRequestError,
    NoWorkerError,
    OverloadedError,
    WorkerCallError,
    WorkerFailedError,
)
from tandem.router.status import abort_with, status_of

C = grpc.StatusCode


@pytest.mark.parametrize(
    ("err", "code"),
    [
        (InvalidRequestError("top_p", "bad"), C.INVALID_ARGUMENT),
        (NoWorkerError("none"), C.UNAVAILABLE),
        (DrainingError("bye"), C.UNAVAILABLE),
        (DeadlineError("late"), C.DEADLINE_EXCEEDED),
        (WorkerFailedError("x"), C.UNAVAILABLE),
        (WorkerFailedError("x", "INVALID_ARGUMENT"), C.INVALID_ARGUMENT),
        (WorkerCallError("h:1", "Decode", "INTERNAL", "boom"), C.UNAVAILABLE),
        (WorkerCallError("h:1", "Decode", "DEADLINE_EXCEEDED", "late"), C.DEADLINE_EXCEEDED),
        (WorkerCallError("h:1", "Decode", "NOT_A_CODE", "?"), C.UNAVAILABLE),
    ],
)
def test_status_codes(err: Exception, code: grpc.StatusCode) -> None:
    got, details, metadata = status_of(err)  # type: ignore[arg-type]
    assert got == code and details and metadata == ()


def test_overload_carries_retry_after() -> None:
    code, details, metadata = status_of(OverloadedError("full", 250))
    assert code == C.RESOURCE_EXHAUSTED and metadata == ((RETRY_AFTER_KEY, "250"),)



class _Context:
    """The two calls abort_with makes on a grpc.aio servicer context."""

    def __init__(self) -> None:
        self.trailers: tuple[tuple[str, str], ...] = ()
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.trailers = metadata

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise grpc.aio.AbortError()


@pytest.mark.parametrize("request_id", [None, "sdk-busy-2"])
def test_abort_repeats_the_request_id_in_the_trailers(request_id: str | None) -> None:
    """A request the router already named keeps its id on failure, in the trailers too."""
    ctx = _Context()
    with pytest.raises(grpc.aio.AbortError):
        asyncio.run(abort_with(ctx, OverloadedError("full", 200),  # type: ignore[arg-type]
                               request_id=request_id))
    assert ctx.aborted == (C.RESOURCE_EXHAUSTED, "full")
    named = ((REQUEST_ID_KEY, request_id),) if request_id else ()
    assert ctx.trailers == ((RETRY_AFTER_KEY, "200"), *named)


@pytest.mark.parametrize(("err", "kept"), [
    (WorkerFailedError("KV push failed: connect to ('10.0.0.7', 7100) refused"), "KV push failed"),
    (NoWorkerError("no decode worker could take the request (last: Reserve failed: "
                   "UNAVAILABLE: ipv4:127.0.0.1:50061: Connection refused)"), "Connection refused"),
    (WorkerCallError("decode-0.tandem.svc:50061", "Decode", "NOT_FOUND",
                      "unknown request on decode-0.tandem.svc:50061"), "unknown request"),
    (WorkerFailedError("failed at [fe80::1]:7100 and shm=/tmp/tandem-x/kv.sock"), "failed at"),
])
def test_details_name_no_worker_address(err: Exception, kept: str) -> None:
    _, details, _ = status_of(err)  # type: ignore[arg-type]
    assert kept in details
    for address in ("10.0.0.7", "127.0.0.1", "50061", "decode-0", "fe80", "/tmp/"):
        assert address not in details, details


def test_request_errors_keep_their_text() -> None:
    msg = "messages[0].content: must be a string, not 12:30 of [0, 1]"
    _, details, _ = status_of(InvalidRequestError("messages", msg))
    assert details == f"messages: {msg}"
