"""Typed errors raised inside the router; tandem/router/status.py maps them to gRPC codes."""

from __future__ import annotations


class RouterError(Exception):
    """Base class of every error the router raises on purpose."""


class InvalidRequestError(RouterError):
    """The client's request is malformed; ``field`` names the culprit (INVALID_ARGUMENT)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class OverloadedError(RouterError):
    """No room for the request right now (RESOURCE_EXHAUSTED); retry after ``retry_after_ms``."""

    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class NoWorkerError(RouterError):
    """No healthy worker can take the request (UNAVAILABLE)."""


class DrainingError(RouterError):
    """The router is shutting down and takes no new requests (UNAVAILABLE)."""


class DeadlineError(RouterError):
    """The request's deadline passed before it finished (DEADLINE_EXCEEDED)."""


class WorkerFailedError(RouterError):
    """A worker failed in a way no fallback could recover from (UNAVAILABLE or its own code).

    ``code_name`` is the worker's gRPC status name (e.g. ``"INVALID_ARGUMENT"``), kept as a
    string so this module does not depend on grpc.
    """

    def __init__(
        self, message: str, code_name: str = "UNAVAILABLE", retry_after_ms: int | None = None
    ) -> None:
        super().__init__(message)
        self.code_name = code_name
        self.retry_after_ms = retry_after_ms


class WorkerCallError(RouterError):
    """One RPC to a worker failed; the handoff decides whether another worker can take over.

    ``code_name`` is the gRPC status name the worker (or the channel) returned;
    ``retry_after_ms`` the worker's retry hint when it sent one (RESOURCE_EXHAUSTED).
    """

    def __init__(
        self,
        endpoint: str,
        method: str,
        code_name: str,
        details: str,
        retry_after_ms: int | None = None,
    ) -> None:
        super().__init__(f"{method} on {endpoint} failed: {code_name}: {details}")
        self.endpoint = endpoint
        self.method = method
        self.code_name = code_name
        self.details = details
        self.retry_after_ms = retry_after_ms


class LegLostError(RouterError):
    """A decode stream broke (worker gone) before its request finished: migrate it."""

    def __init__(self, endpoint: str, reason: str) -> None:
        super().__init__(f"decode stream on {endpoint} lost: {reason}")
        self.endpoint = endpoint
