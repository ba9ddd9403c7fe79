"""The HTTP edge of the router's typed errors, in OpenAI's JSON error shape.

    {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}

The status follows the gRPC code tandem/router/status.py gives the same error (one mapping for both
edges): INVALID_ARGUMENT 400, RESOURCE_EXHAUSTED 429 (+ Retry-After), UNAVAILABLE 503,
DEADLINE_EXCEEDED 504; an unknown model is 404 as in OpenAI's API. Refusals only HTTP has
(a body too large: 413, too slow: 408) are ``HttpRefusal``s. A 429 whose cause is not load
says so in its ``code`` ("grammar_compiling": the request's structured-output grammar is still
compiling), with the same Retry-After.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import grpc

from tandem.router.errors import Busy, InvalidRequestError, OverloadedError, RouterError
from tandem.router.status import status_of

_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}

_BUSY_CODES = {Busy.GRAMMAR: "grammar_compiling"}  # a 429's code when it is not load


@dataclass(frozen=True, slots=True)
class HttpError:
    """A status, the OpenAI error body and any extra headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str]


class HttpRefusal(Exception):
    """A request the HTTP edge refuses on its own (no RouterError says it): ``error`` is
    what the client gets; ``close`` ends the connection after it (the rest of a body that
    was refused may still be arriving)."""

    def __init__(self, status: int, message: str, param: str | None, code: str,
                 close: bool = False) -> None:
        super().__init__(message)
        self.error = HttpError(status, error_body(status, message, param, code), {})
        self.close = close


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error object for ``status``."""
    kind = _TYPES.get(status, "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def http_error(err: RouterError) -> HttpError:
    """What an HTTP client sees for ``err``."""
    code, details, _ = status_of(err)
    status = _STATUS.get(code, 500)
    param: str | None = None
    headers: dict[str, str] = {}
    reason = code.name.lower()
    if isinstance(err, InvalidRequestError):
        param = err.field
        if err.field == "model":
            status, reason = 404, "model_not_found"
    if isinstance(err, OverloadedError):
        if err.busy is not None:
            reason = _BUSY_CODES[err.busy]
        headers["Retry-After"] = str(max(1, math.ceil(err.retry_after_ms / 1000)))
        headers["Retry-After-Ms"] = str(err.retry_after_ms)
    return HttpError(status, error_body(status, details, param, reason), headers)
