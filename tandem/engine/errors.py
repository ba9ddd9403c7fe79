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


class NotMovableError(EngineError):
    """A running request cannot be moved to another engine now; the message says why (not
    decoding yet, finished, not forked yet ...). It runs on here."""


class UnknownRequestError(EngineError, KeyError):
    """An operation named a request id that the engine does not hold."""


class ModelLoadError(EngineError):
    """A model path, alias or checkpoint could not be resolved, converted or loaded."""


class UnsupportedModelError(ModelLoadError):
    """The checkpoint's family (a config's ``model_type`` or a GGUF's architecture) has no
    model here; raised before any weight is read or converted."""

    def __init__(self, kind: str, name: str, supported: tuple[str, ...]) -> None:
        super().__init__(f"{kind} {name!r} is not supported (supported: {', '.join(supported)})")
        self.name = name
        self.supported = supported


class UnsupportedConfigError(ModelLoadError):
    """A config field that changes the forward holds a value our models do not compute."""

    def __init__(self, model_type: str, field: str, value: object, why: str) -> None:
        super().__init__(f"{model_type} config: {field}={value!r} is not supported ({why})")
        self.field = field
        self.value = value


class UnusedTensorsError(ModelLoadError):
    """The checkpoint holds tensors the model did not consume: serving it would silently
    leave part of the model out."""

    def __init__(self, names: list[str]) -> None:
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        super().__init__(f"{len(names)} checkpoint tensor(s) not used by the model: {shown}")
        self.names = names


class ContextLengthError(ModelLoadError):
    """``max_model_len`` asks for more context than the model computes exactly."""

    def __init__(self, asked: int, limit: int, why: str) -> None:
        super().__init__(f"max_model_len {asked} is above the model's limit {limit} ({why})")
        self.asked = asked
        self.limit = limit
