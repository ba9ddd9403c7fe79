"""Typed errors of the Tandem SDK, mapped from the gRPC status codes the router returns.

Callers catch what they can act on (``Overloaded``: wait ``retry_after_s`` and try again;
``InvalidRequest``: fix the request) instead of inspecting status codes:

    INVALID_ARGUMENT, OUT_OF_RANGE, FAILED_PRECONDITION -> InvalidRequest
    RESOURCE_EXHAUSTED                                  -> Overloaded (retry_after_s from the
                                                           ``retry-after-ms`` trailer)
    UNAVAILABLE                                         -> Unavailable
    DEADLINE_EXCEEDED                                   -> DeadlineExceeded
    CANCELLED                                           -> Cancelled
    UNAUTHENTICATED, PERMISSION_DENIED                  -> AuthError
    NOT_FOUND                                           -> NotFound
    anything else                                       -> Internal

A generation the router had accepted before it failed (overloaded in its queue, no worker, a
deadline) names the request: ``request_id`` is the id the router echoed in the call's
initial metadata and again in its trailers (``x-request-id``: the caller's own id when it gave
one, else the router's), the one its log lines carry. Errors the router raised before accepting the request (a bad
argument, a missing key) or that never reached it have none.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc

from tandem.common.wire import (
    REQUEST_ID_KEY,  # the initial metadata naming an accepted generation
    RETRY_AFTER_KEY,  # the trailer the router sets on RESOURCE_EXHAUSTED
)


class TandemError(Exception):
    """Base class of every error the SDK raises; ``code`` is the gRPC status code name,
    ``request_id`` the router's name for the failed request ("" when it named none: see the
    module notes)."""

    code: str = "UNKNOWN"
    request_id: str = ""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        text = f"{self.code}: {self.message}" if self.message else self.code
        return f"{text} (request_id={self.request_id})" if self.request_id else text


class InvalidRequest(TandemError, ValueError):
    """The request is malformed (bad prompt, sampling value, model name); fix it, do not retry."""

    code = "INVALID_ARGUMENT"


class Overloaded(TandemError):
    """The service is full right now; retry after ``retry_after_s`` (None: the server sent no
    retry info, so it does not invite a retry)."""

    code = "RESOURCE_EXHAUSTED"

    def __init__(
        self, message: str, code: str | None = None, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message, code)
        self.retry_after_s = retry_after_s


class Unavailable(TandemError):
    """The service cannot be reached or has no healthy worker; usually transient."""

    code = "UNAVAILABLE"


class DeadlineExceeded(TandemError, TimeoutError):
    """The call's deadline passed before it finished."""

    code = "DEADLINE_EXCEEDED"


class Cancelled(TandemError):
    """The call was cancelled (by this client or the server)."""

    code = "CANCELLED"


class AuthError(TandemError):
    """The API key is missing or wrong (UNAUTHENTICATED) or not allowed (PERMISSION_DENIED)."""

    code = "UNAUTHENTICATED"


class NotFound(TandemError):
    """The method or resource does not exist on this server."""

    code = "NOT_FOUND"


class Internal(TandemError):
    """The server failed in a way the client cannot fix (INTERNAL, UNKNOWN, UNIMPLEMENTED...)."""

    code = "INTERNAL"


_BY_CODE: dict[str, type[TandemError]] = {
    "INVALID_ARGUMENT": InvalidRequest,
    "OUT_OF_RANGE": InvalidRequest,
    "FAILED_PRECONDITION": InvalidRequest,
    "RESOURCE_EXHAUSTED": Overloaded,
    "UNAVAILABLE": Unavailable,
    "DEADLINE_EXCEEDED": DeadlineExceeded,
    "CANCELLED": Cancelled,
    "UNAUTHENTICATED": AuthError,
    "PERMISSION_DENIED": AuthError,
    "NOT_FOUND": NotFound,
}


def metadata_value(metadata: Iterable[Any] | None, key: str) -> str:
    """The text value of ``key`` in call metadata ((key, value) pairs, sync or async), or ""
    when absent."""
    for item in metadata or ():
        if item[0] == key:
            value = item[1]
            return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
    return ""


def retry_after_s(metadata: Iterable[Any] | None) -> float | None:
    """Seconds from the ``retry-after-ms`` trailer, or None when absent or unreadable.

    ``metadata`` is what ``call.trailing_metadata()`` returns: (key, value) pairs (sync) or
    ``grpc.aio.Metadata`` (async), whose iteration also yields pairs.
    """
    try:
        ms = float(metadata_value(metadata, RETRY_AFTER_KEY))
    except ValueError:  # absent ("") or not a number
        return None
    return ms / 1000.0 if ms >= 0 else None


def from_status(code: str, details: str, metadata: Iterable[Any] | None = None) -> TandemError:
    """The typed error for status ``code`` (a ``grpc.StatusCode`` name) and its details."""
    cls = _BY_CODE.get(code, Internal)
    if cls is Overloaded:
        return Overloaded(details, code, retry_after_s=retry_after_s(metadata))
    return cls(details, code)


def from_rpc_error(err: grpc.RpcError) -> TandemError:
    """Map a failed gRPC call (sync ``grpc.Call`` or ``grpc.aio.AioRpcError``) to its type."""
    code_fn = getattr(err, "code", None)
    if code_fn is None:  # an RpcError that is not a call: treat as transport failure
        return Unavailable(str(err))
    code = code_fn()
    name = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
    details = err.details() if hasattr(err, "details") else str(err)
    trailers = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    typed = from_status(name, details or "", trailers)
    # A finished call's initial metadata is at hand (sync calls do not block for it then).
    initial = err.initial_metadata() if hasattr(err, "initial_metadata") else None
    # The trailers repeat it: a grpc.aio stream that fails at its first read may not have
    # the initial metadata yet.
    typed.request_id = (metadata_value(initial, REQUEST_ID_KEY)
                        or metadata_value(trailers, REQUEST_ID_KEY))
    typed.__cause__ = err
    return typed
