"""The cluster credential on gRPC: a server interceptor that refuses callers without it, and
client interceptors that attach it to every call.

    member ──[x-tandem-cluster: v1.<ts>.<nonce>.<mac over the method>]──> member
        server: ClusterAuthInterceptor ──verify(token, method)──> handler | UNAUTHENTICATED

Applied to: every worker RPC but grpc.health.v1 (probes carry no secret and health reveals
nothing), the router's Registry (membership is proven, never claimed). The router's public
``Tandem`` service is guarded by API keys instead (tandem/router/auth.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from tandem.common.security.credential import ClusterCredential

METADATA_KEY = "x-tandem-cluster"
HEALTH_SERVICE = "grpc.health.v1.Health"
_REFUSAL = "missing or invalid cluster credential (internal RPCs need --cluster-secret-file)"


def refusing(handler: grpc.RpcMethodHandler, reason: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that aborts with UNAUTHENTICATED."""

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)

    async def streaming(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)
        yield  # pragma: no cover - makes this an async generator; abort always raises

    codecs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(unary, **codecs)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(streaming, **codecs)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(unary, **codecs)
    return grpc.stream_stream_rpc_method_handler(streaming, **codecs)


class ClusterAuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls to the ``protected`` services (all but ``open_services`` when
    ``protected`` is None) that carry no valid cluster token."""

    def __init__(
        self,
        credential: ClusterCredential,
        protected: Sequence[str] | None = None,
        open_services: Sequence[str] = (HEALTH_SERVICE,),
    ) -> None:
        self._credential = credential
        self._protected = None if protected is None else tuple(f"/{s}/" for s in protected)
        self._open = tuple(f"/{s}/" for s in open_services)

    def _guards(self, method: str) -> bool:
        if self._protected is not None:
            return method.startswith(self._protected)
        return not method.startswith(self._open)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or self._credential.insecure or not self._guards(details.method):
            return handler
        token = dict(details.invocation_metadata or ()).get(METADATA_KEY)
        if isinstance(token, str) and self._credential.verify(token, details.method):
            return handler
        return refusing(handler, _REFUSAL)


def _method(details: Any) -> str:
    method = details.method
    return method.decode() if isinstance(method, bytes) else str(method)


def _with_token(credential: ClusterCredential, details: Any, method: str) -> list[tuple[str, str]]:
    metadata = [(k, v) for k, v in (details.metadata or ()) if k != METADATA_KEY]
    metadata.append((METADATA_KEY, credential.grpc_token(method)))
    return metadata


class _AioTokens:
    """Adds the cluster token to a call's metadata (the aio channel files an interceptor
    under its first matching kind only, so each kind gets its own object below)."""

    def __init__(self, credential: ClusterCredential) -> None:
        self._credential = credential

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        method = _method(details)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout,
            grpc.aio.Metadata(*_with_token(self._credential, details, method)),
            details.credentials, details.wait_for_ready,
        )


class _AioUnaryTokens(_AioTokens, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _AioStreamTokens(_AioTokens, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _SyncDetails(grpc.ClientCallDetails):
    def __init__(self, method: str, timeout: Any, metadata: Any, credentials: Any,
                 wait_for_ready: Any, compression: Any) -> None:
        self.method, self.timeout, self.metadata = method, timeout, metadata
        self.credentials, self.wait_for_ready, self.compression = (credentials, wait_for_ready,
                                                                   compression)


class _SyncTokens(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """The same for a synchronous channel (``tandem top``)."""

    def __init__(self, credential: ClusterCredential) -> None:
        self._credential = credential

    def _details(self, details: Any) -> _SyncDetails:
        method = _method(details)
        return _SyncDetails(details.method, details.timeout,
                            _with_token(self._credential, details, method), details.credentials,
                            getattr(details, "wait_for_ready", None),
                            getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)


def aio_interceptors(credential: ClusterCredential) -> list[grpc.aio.ClientInterceptor]:
    """Client interceptors for ``grpc.aio.*_channel(..., interceptors=...)`` (none when
    insecure: there is nothing to prove)."""
    if credential.insecure:
        return []
    return [_AioUnaryTokens(credential), _AioStreamTokens(credential)]


def sync_channel(channel: grpc.Channel, credential: ClusterCredential) -> grpc.Channel:
    """``channel`` with the cluster token on every call."""
    return channel if credential.insecure else grpc.intercept_channel(channel,
                                                                      _SyncTokens(credential))
