"""The gRPC edge of the router's typed errors: status code, details, trailing metadata.

The details name no worker: addresses are redacted (tandem/router/errors.py) here, where both
edges (gRPC and HTTP, tandem/router/http/errors.py) take an error's text from. A refusal for
now that is not for lack of room says why in a ``tandem-busy`` trailer (``OverloadedError.busy``:
"grammar", the request's grammar is still compiling)."""

from __future__ import annotations

from typing import NoReturn

import grpc

from tandem.common.wire import BUSY_KEY, REQUEST_ID_KEY, RETRY_AFTER_KEY
from tandem.router.errors import (
    DeadlineError,
    DrainingError,
    InvalidRequestError,
    NoWorkerError,
    OverloadedError,
    RouterError,
    WorkerCallError,
    WorkerFailedError,
    redact_addresses,
)

# Retry hint for RESOURCE_EXHAUSTED from a worker that sent none.
DEFAULT_RETRY_AFTER_MS = 250


def status_of(err: RouterError) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """The status code, details and trailing metadata a client sees for ``err`` (the
    details with every address redacted)."""
    code, details, metadata = _status_of(err)
    return code, redact_addresses(details), metadata


def _status_of(err: RouterError) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    if isinstance(err, InvalidRequestError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(err), ()
    if isinstance(err, OverloadedError):
        busy = () if err.busy is None else ((BUSY_KEY, err.busy.value),)
        return (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            str(err),
            ((RETRY_AFTER_KEY, str(err.retry_after_ms)), *busy),
        )
    if isinstance(err, (NoWorkerError, DrainingError)):
        return grpc.StatusCode.UNAVAILABLE, str(err), ()
    if isinstance(err, DeadlineError):
        return grpc.StatusCode.DEADLINE_EXCEEDED, str(err), ()
    if isinstance(err, (WorkerFailedError, WorkerCallError)):
        code = _code(err.code_name)
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:  # a full worker: say when to come back
            hint = err.retry_after_ms or DEFAULT_RETRY_AFTER_MS
            return code, str(err), ((RETRY_AFTER_KEY, str(hint)),)
        return code, str(err), ()
    return grpc.StatusCode.INTERNAL, str(err), ()


def _code(name: str) -> grpc.StatusCode:
    code = grpc.StatusCode.__members__.get(name, grpc.StatusCode.UNAVAILABLE)
    # A worker's internal trouble is the service being unavailable, from the client's side.
    if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED):
        return grpc.StatusCode.UNAVAILABLE
    return code


async def abort_with(
    context: grpc.aio.ServicerContext, err: RouterError, request_id: str | None = None
) -> NoReturn:
    """End the RPC with ``err``'s status (never returns).

    ``request_id``: the id the call was already named by (sent in its initial metadata), repeated
    in the trailers: a client that sees the status before the initial metadata (a grpc.aio
    stream failing at its first read may) still learns which request failed."""
    code, details, metadata = status_of(err)
    if request_id:
        metadata = (*metadata, (REQUEST_ID_KEY, request_id))
    if metadata:
        context.set_trailing_metadata(metadata)
    await context.abort(code, details)
    raise AssertionError("context.abort returned")  # pragma: no cover - abort always raises
