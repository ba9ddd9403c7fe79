"""Typed errors -> gRPC status at the edge: code, details, retry trailer."""

from __future__ import annotations

import grpc
import pytest

from common.wire import RETRY_AFTER_KEY
from router.errors import (
    DeadlineError,
    DrainingError,
    InvalidRequestError,
    NoWorkerError,
    OverloadedError,
    WorkerCallError,
    WorkerFailedError,
)
from router.status import status_of

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

