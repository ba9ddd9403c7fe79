"""The cluster credential on gRPC: a server interceptor that refuses callers without it, and
client interceptors that attach it to every call.

    member ──[x-tandem-cluster: v2.<ts>.<nonce>.<MAC(method, audience, sha256(request))>]──>
        ClusterAuthInterceptor (server)
          token not even shaped like one ──────────────> UNAUTHENTICATED
          unary request: the raw request bytes are kept, their digest checked with the
            token (verify) before they are parsed ──ok──> the servicer's behaviour
                                                   └─no─> UNAUTHENTICATED
          streamed request: checked at call start with the digest ``STREAMED``

The audience is the callee: a client names it per channel (the address it dials a worker by,
or ``ROUTER_AUDIENCE`` for the router) and a server answers to the names it knows itself by
(``worker_audience``: its bound address, and its loopback or host names when it binds one).
So a token captured on its way to one worker opens nothing on another worker, nor another
method, nor the same method with another request; and never twice (the nonce).

Applied to: every worker RPC but grpc.health.v1 (probes carry no secret and health reveals
nothing), the router's Registry (membership is proven, never claimed). The router's public
``Tandem`` service is guarded by API keys instead (tandem/router/auth.py).
"""

from __future__ import annotations

import inspect
import ipaddress
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any

import grpc

from tandem.common.security.credential import (
    ROUTER_AUDIENCE,
    STREAMED,
    ClusterCredential,
    request_digest,
)

log = logging.getLogger(__name__)

METADATA_KEY = "x-tandem-cluster"
HEALTH_SERVICE = "grpc.health.v1.Health"
_REFUSAL = "missing or invalid cluster credential (internal RPCs need --cluster-secret-file)"
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]", "::1")
_WILDCARDS = ("", "0.0.0.0", "::", "[::]")

__all__ = [
    "HEALTH_SERVICE", "METADATA_KEY", "ROUTER_AUDIENCE", "ClusterAuthInterceptor",
    "aio_interceptors", "is_loopback", "refusing", "sync_channel", "worker_audience",
]


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach ``host`` (a wildcard or a name is not)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_names() -> set[str]:
    """This host's name and the addresses it resolves to (what a wildcard bind is dialed by)."""
    names = {socket.gethostname(), socket.getfqdn()}
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None)
    except OSError:
        infos = []
    names.update(str(info[4][0]) for info in infos)
    return {n for n in names if n}


def worker_audience(host: str, port: int) -> frozenset[str]:
    """The names a server bound to ``host:port`` answers to: that address, and the other names
    of the same socket a caller on this host or network may dial (loopback aliases for a
    loopback bind; this host's names too for a wildcard bind). A worker on another port or
    another host answers to none of them."""
    names = {f"{host}:{port}"}
    if is_loopback(host) or host in _WILDCARDS:
        names.update(f"{n}:{port}" for n in _LOOPBACK_NAMES)
    if host in _WILDCARDS:
        names.update(f"[{n}]:{port}" if ":" in n else f"{n}:{port}" for n in _host_names())
    return frozenset(names)


def refusing(handler: grpc.RpcMethodHandler, reason: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that aborts with UNAUTHENTICATED (it never
    parses the request: a stranger's bytes are not read)."""

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)

    async def streaming(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)
        yield  # pragma: no cover - makes this an async generator; abort always raises

    codecs = {"request_deserializer": None, "response_serializer": handler.response_serializer}
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(unary, **codecs)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(streaming, **codecs)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(unary, **codecs)
    return grpc.stream_stream_rpc_method_handler(streaming, **codecs)


Check = Callable[[str], bool]  # the request digest -> whether the call's token covers it


def bound_to_request(handler: grpc.RpcMethodHandler, check: Check,
                     reason: str) -> grpc.RpcMethodHandler:
    """``handler`` (a unary-request one) behind a check of its request: the raw bytes are
    kept by the deserializer, ``check(request_digest(bytes))`` decides, and only then are they
    parsed and handed to the original behaviour. Generic over every service."""
    parse = handler.request_deserializer or (lambda data: data)

    async def admit(data: bytes, context: grpc.aio.ServicerContext) -> Any:
        if not check(request_digest(data)):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)
        try:
            return parse(data)
        except Exception:  # a member's malformed message: the caller's error, named
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request does not parse")

    codecs = {"request_deserializer": None, "response_serializer": handler.response_serializer}
    if handler.unary_unary:
        inner_unary = handler.unary_unary

        async def unary(data: bytes, context: grpc.aio.ServicerContext) -> Any:
            result = inner_unary(await admit(data, context), context)
            return await result if inspect.isawaitable(result) else result

        return grpc.unary_unary_rpc_method_handler(unary, **codecs)
    inner_stream = handler.unary_stream
    if inspect.isasyncgenfunction(inner_stream):
        async def stream(data: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            request = await admit(data, context)
            async for item in inner_stream(request, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(stream, **codecs)

    async def writes(data: bytes, context: grpc.aio.ServicerContext) -> Any:
        # a behaviour that streams with ``context.write`` (a coroutine, not a generator)
        return await inner_stream(await admit(data, context), context)

    return grpc.unary_stream_rpc_method_handler(writes, **codecs)


class ClusterAuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls to the ``protected`` services (all but ``open_services`` when
    ``protected`` is None) whose token was not minted for the method, this server (one of
    ``audience``, or of what ``answer_to`` set once the port was bound) and the request."""

    def __init__(
        self,
        credential: ClusterCredential,
        audience: Iterable[str] = (),
        protected: Sequence[str] | None = None,
        open_services: Sequence[str] = (HEALTH_SERVICE,),
    ) -> None:
        self._credential = credential
        self._audience = frozenset(audience)
        self._protected = None if protected is None else tuple(f"/{s}/" for s in protected)
        self._open = tuple(f"/{s}/" for s in open_services)

    def answer_to(self, audience: Iterable[str]) -> None:
        """The names this server answers to (set once it knows its port)."""
        self._audience = frozenset(audience)

    @property
    def audience(self) -> frozenset[str]:
        """The names this server answers to."""
        return self._audience

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
        method = _method(details)
        if handler is None or self._credential.insecure or not self._guards(method):
            return handler
        try:
            token = dict(details.invocation_metadata or ()).get(METADATA_KEY)
        except (TypeError, ValueError):  # metadata that is not key/value pairs
            token = None
        if not isinstance(token, str):
            return refusing(handler, _REFUSAL)
        credential, audience = self._credential, self._audience

        def check(digest: str) -> bool:
            return credential.verify(token, method, audience, digest)

        if handler.request_streaming:  # bound at call start: the messages come later
            return handler if check(STREAMED) else refusing(handler, _REFUSAL)
        return bound_to_request(handler, check, _REFUSAL)


def _method(details: Any) -> str:
    method = details.method
    return method.decode() if isinstance(method, bytes) else str(method)


def _digest_of(request: Any) -> str:
    if isinstance(request, (bytes, bytearray, memoryview)):
        return request_digest(bytes(request))
    return request_digest(request.SerializeToString())


def _with_token(credential: ClusterCredential, details: Any, audience: str,
                digest: str) -> list[tuple[str, str]]:
    metadata = [(k, v) for k, v in (details.metadata or ()) if k != METADATA_KEY]
    metadata.append((METADATA_KEY, credential.grpc_token(_method(details), audience, digest)))
    return metadata


class _AioTokens:
    """Adds the cluster token to a call's metadata (the aio channel files an interceptor
    under its first matching kind only, so each kind gets its own object below)."""

    def __init__(self, credential: ClusterCredential, audience: str) -> None:
        self._credential = credential
        self._audience = audience

    def _details(self, details: grpc.aio.ClientCallDetails,
                 digest: str) -> grpc.aio.ClientCallDetails:
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout,
            grpc.aio.Metadata(*_with_token(self._credential, details, self._audience, digest)),
            details.credentials, details.wait_for_ready,
        )


class _AioUnaryTokens(_AioTokens, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details, _digest_of(request)), request)


class _AioStreamTokens(_AioTokens, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details, _digest_of(request)), request)


class _AioStreamUnaryTokens(_AioTokens, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any,
                                     request_iterator: Any) -> Any:
        return await continuation(self._details(details, STREAMED), request_iterator)


class _AioStreamStreamTokens(_AioTokens, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any,
                                      request_iterator: Any) -> Any:
        return await continuation(self._details(details, STREAMED), request_iterator)


class _SyncDetails(grpc.ClientCallDetails):
    def __init__(self, method: str, timeout: Any, metadata: Any, credentials: Any,
                 wait_for_ready: Any, compression: Any) -> None:
        self.method, self.timeout, self.metadata = method, timeout, metadata
        self.credentials, self.wait_for_ready, self.compression = (credentials, wait_for_ready,
                                                                   compression)


class _SyncTokens(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """The same for a synchronous channel (``tandem top``, tests, launchers)."""

    def __init__(self, credential: ClusterCredential, audience: str) -> None:
        self._credential = credential
        self._audience = audience

    def _details(self, details: Any, request: Any) -> _SyncDetails:
        metadata = _with_token(self._credential, details, self._audience, _digest_of(request))
        return _SyncDetails(details.method, details.timeout, metadata, details.credentials,
                            getattr(details, "wait_for_ready", None),
                            getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details, request), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details, request), request)


def aio_interceptors(credential: ClusterCredential,
                     audience: str) -> list[grpc.aio.ClientInterceptor]:
    """Client interceptors for ``grpc.aio.*_channel(target, ..., interceptors=...)``, minting
    tokens for ``audience`` (``target`` itself for a worker, ``ROUTER_AUDIENCE`` for the
    router); none when insecure: there is nothing to prove."""
    if credential.insecure:
        return []
    return [kind(credential, audience) for kind in (_AioUnaryTokens, _AioStreamTokens,
                                                    _AioStreamUnaryTokens, _AioStreamStreamTokens)]


def sync_channel(channel: grpc.Channel, credential: ClusterCredential,
                 audience: str) -> grpc.Channel:
    """``channel`` with the cluster token on every call, minted for ``audience``."""
    return channel if credential.insecure else grpc.intercept_channel(
        channel, _SyncTokens(credential, audience))
