"""Typed errors raised by the engine.

Inside the engine every failure is one of these; the gRPC and HTTP edges map them to status
codes (InvalidRequestError -> INVALID_ARGUMENT / 400; OutOfBlocksError, GrammarBusyError ->
RESOURCE_EXHAUSTED).
"""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class InvalidRequestError(EngineError, ValueError):
    """A request (prompt or sampling parameter) is malformed; ``field`` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class OutOfBlocksError(EngineError):
    """The KV cache cannot hold what was asked for (a reservation larger than the free pool)."""


class GrammarBusyError(EngineError):
    """A request's grammar is not compiled yet and its wait is over (the compile queue is full,
    or other compiles hold it): a retry later may find it compiled; nothing was refused."""


class UnknownRequestError(EngineError, KeyError):
    """An operation named a request id that the engine does not hold."""


class ModelLoadError(EngineError):
    """A model path, alias or checkpoint could not be resolved or converted."""
