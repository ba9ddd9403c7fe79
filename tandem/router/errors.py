"""Typed errors raised inside the router; tandem/router/status.py maps them to gRPC codes.

What a client reads of an error names no worker: an error about a worker keeps its address
in ``endpoint`` (for the router's logs), never in its message, and ``redact_addresses``
takes out any address a worker's own details carry before the edges send them.
"""

from __future__ import annotations

import enum
import re

from tandem.common.wire import GRAMMAR_BUSY


class RouterError(Exception):
    """Base class of every error the router raises on purpose."""


class InvalidRequestError(RouterError):
    """The client's request is malformed; ``field`` names the culprit (INVALID_ARGUMENT)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class Busy(enum.Enum):
    """Why a worker refused a request for now when it is not for lack of room (the
    ``tandem-busy`` trailer, tandem/common/wire.py); the client is told the same."""

    GRAMMAR = GRAMMAR_BUSY  # the request's structured-output grammar is still compiling


class OverloadedError(RouterError):
    """No room for the request right now (RESOURCE_EXHAUSTED); retry after ``retry_after_ms``.
    ``busy``: the refusal is not for lack of room but for that reason (None: load)."""

    def __init__(self, message: str, retry_after_ms: int, busy: Busy | None = None) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms
        self.busy = busy


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


class Fault(enum.Enum):
    """Whom a failed worker call points at (tandem/router/handoff/blame.py reads it)."""

    WORKER = "worker"  # the worker called, or the channel to it
    RECEIVER = "receiver"  # the decode worker the called prefill worker pushed KV to
    SLOW = "slow"  # no answer within the router's own bound for the call: a slow call
    SUSPENDED = "suspended"  # a Decode stream ended by its request's live move (not a fault)


class WorkerCallError(RouterError):
    """One RPC to a worker failed; the handoff decides whether another worker can take over.

    ``code_name`` is the gRPC status name the worker (or the channel) returned;
    ``retry_after_ms`` the worker's retry hint when it sent one (RESOURCE_EXHAUSTED);
    ``fault`` whom the failure points at (a prefill worker says when its receiver failed);
    ``busy`` why a RESOURCE_EXHAUSTED worker refused when it said (else None: it is full).
    """

    def __init__(
        self,
        endpoint: str,
        method: str,
        code_name: str,
        details: str,
        retry_after_ms: int | None = None,
        fault: Fault = Fault.WORKER,
        busy: Busy | None = None,
    ) -> None:
        super().__init__(f"{method} failed: {code_name}: {details}")
        self.endpoint = endpoint
        self.method = method
        self.code_name = code_name
        self.details = details
        self.retry_after_ms = retry_after_ms
        self.fault = fault
        self.busy = busy


class LegLostError(RouterError):
    """A decode leg was lost before its request finished (its stream broke, its worker went
    away, or its prefill worker could not reach it): migrate it. ``down``: the loss says
    the worker itself is gone (the channel to it failed), so it leaves the pool."""

    def __init__(self, endpoint: str, reason: str, down: bool = False) -> None:
        super().__init__(f"decode leg lost: {reason}")
        self.endpoint = endpoint
        self.reason = reason
        self.down = down


class LegSuspendedError(RouterError):
    """A decode stream ended because its request left the batch for a live move
    (DecodeService.Suspend): every token so far came before it; move or resume the leg."""

    def __init__(self, endpoint: str) -> None:
        super().__init__("decode leg suspended for a live move")
        self.endpoint = endpoint


# What an address looks like in an error's text: an IPv4 address (and port), a bracketed
# IPv6 one, host:port, a Unix socket target, a Python (host, port) tuple's host.
_ADDRESS = re.compile(
    r"\b(?:unix|unix-abstract|shm|tcp)[:=]\S+"
    r"|\[[0-9A-Fa-f.%\w]*:[0-9A-Fa-f:.%\w]*\](?::\d{1,5})?"
    r"|\b\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?\b"
    r"|\b(?=[A-Za-z0-9.-]*[A-Za-z])[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?:\d{2,5}\b(?![.\d])"
)
REDACTED = "<worker>"


def redact_addresses(text: str) -> str:
    """``text`` with every network address in it replaced by ``<worker>``: what the
    edges send a client of an error (the cluster's inside is not the client's to see)."""
    return _ADDRESS.sub(REDACTED, text)
