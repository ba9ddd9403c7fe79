"""Tandem: disaggregated LLM serving. What users import and run (SDK, CLI, launcher).

``import tandem`` gives the client SDK (grpcio and protobuf only; no torch, no ray):
``tandem.Client``, ``tandem.AsyncClient``, ``tandem.ClientConfig``, ``tandem.SamplingOptions``
and the typed errors. The names load on first use, so ``tandem <command>`` and the launcher do
not pay for the SDK.

Two distributions carry this package (docs/client.md): ``tandem-serve`` (the repository's
pyproject.toml: everything) and ``tandem-client`` (packaging/tandem-client: the SDK, the client
commands and what they import, nothing that needs torch, ray or kubernetes).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "AsyncChunkStream": "tandem.sdk.async_client",
    "AsyncClient": "tandem.sdk.async_client",
    "ChunkStream": "tandem.sdk.client",
    "Client": "tandem.sdk.client",
    "ClientConfig": "tandem.sdk.client_config",
    "TLSConfig": "tandem.sdk.client_config",
    "RetryPolicy": "tandem.sdk.retry",
    "SamplingOptions": "tandem.sdk.sampling",
    "GenerateResult": "tandem.sdk.results",
    "ModelInfo": "tandem.sdk.results",
    "StreamChunk": "tandem.sdk.results",
    "Timings": "tandem.sdk.results",
    "TokenLogprob": "tandem.sdk.results",
    "Usage": "tandem.sdk.results",
    "AuthError": "tandem.sdk.errors",
    "Cancelled": "tandem.sdk.errors",
    "DeadlineExceeded": "tandem.sdk.errors",
    "Internal": "tandem.sdk.errors",
    "InvalidRequest": "tandem.sdk.errors",
    "NotFound": "tandem.sdk.errors",
    "Overloaded": "tandem.sdk.errors",
    "TandemError": "tandem.sdk.errors",
    "Unavailable": "tandem.sdk.errors",
}

__all__ = [
    "AsyncChunkStream",
    "AsyncClient",
    "AuthError",
    "Cancelled",
    "ChunkStream",
    "Client",
    "ClientConfig",
    "DeadlineExceeded",
    "GenerateResult",
    "Internal",
    "InvalidRequest",
    "ModelInfo",
    "NotFound",
    "Overloaded",
    "RetryPolicy",
    "SamplingOptions",
    "StreamChunk",
    "TLSConfig",
    "TandemError",
    "Timings",
    "TokenLogprob",
    "Unavailable",
    "Usage",
]

if TYPE_CHECKING:
    from tandem.sdk.async_client import AsyncChunkStream, AsyncClient
    from tandem.sdk.client import ChunkStream, Client
    from tandem.sdk.client_config import ClientConfig, TLSConfig
    from tandem.sdk.errors import (
        AuthError,
        Cancelled,
        DeadlineExceeded,
        Internal,
        InvalidRequest,
        NotFound,
        Overloaded,
        TandemError,
        Unavailable,
    )
    from tandem.sdk.results import (
        GenerateResult,
        ModelInfo,
        StreamChunk,
        Timings,
        TokenLogprob,
        Usage,
    )
    from tandem.sdk.retry import RetryPolicy
    from tandem.sdk.sampling import SamplingOptions


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tandem' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
