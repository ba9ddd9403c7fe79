"""API keys on the router's public edges: the gRPC ``Tandem`` service and the HTTP API.

Keys come from a file (``--api-key-file``): one key per line, ``#`` starts a comment, blank
lines are skipped; and from the command line or a config file (``--api-key KEY``, repeatable,
vLLM's name). A client presents one as ``authorization: Bearer <key>`` (gRPC metadata or
the HTTP header). Health checks stay open so load balancers and probes need no secret.

Keys are kept only as SHA-256 digests and every stored digest is compared with
``hmac.compare_digest`` (no early exit), so neither the match position nor the key length
leaks through timing. Keys are never logged.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path

import grpc

from tandem.common.security.grpc_auth import refusing

BEARER = "bearer "


class ApiKeyFileError(ValueError):
    """The API key file is missing, unreadable or holds no key."""


class ApiKeys:
    """A set of accepted keys; ``allows`` checks an ``Authorization`` header value."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = tuple(_digest(k) for k in keys)
        if not self._digests:
            raise ApiKeyFileError("no API keys given")

    @classmethod
    def from_file(cls, path: str | Path) -> ApiKeys:
        """Keys of ``path`` (one per line, ``#`` comments); raises ApiKeyFileError."""
        return cls(_read_key_file(path))

    @classmethod
    def load(cls, path: str | Path, inline: Sequence[str] = ()) -> ApiKeys | None:
        """The keys of the file ``path`` (when not "") and the ``inline`` ones (``--api-key``);
        None when there are none at all (an open API). Raises ApiKeyFileError, never quoting
        a key."""
        for key in inline:
            if not key or any(c.isspace() for c in key):
                raise ApiKeyFileError("an --api-key value is empty or has spaces")
        keys = [*inline, *(_read_key_file(path) if path else ())]
        return cls(keys) if keys else None

    def __len__(self) -> int:
        return len(self._digests)

    def allows(self, authorization: str | None) -> bool:
        """True when ``authorization`` is ``Bearer <key>`` for one of the keys."""
        if not authorization or not authorization[: len(BEARER)].lower() == BEARER:
            return False
        candidate = _digest(authorization[len(BEARER) :].strip())
        ok = False
        for digest in self._digests:  # all of them, always: constant time in the match
            ok |= hmac.compare_digest(candidate, digest)
        return ok


def _read_key_file(path: str | Path) -> list[str]:
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ApiKeyFileError(f"cannot read the API key file {str(path)!r}: {err}") from err
    keys = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    keys = [k for k in keys if k]
    if not keys:
        raise ApiKeyFileError(f"the API key file {str(path)!r} holds no key")
    for key in keys:
        if any(c.isspace() for c in key):
            raise ApiKeyFileError(f"the API key file {str(path)!r} has a key with spaces")
    return keys


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls to the ``protected`` gRPC services without a valid key (UNAUTHENTICATED).

    Services not listed (health, reflection, the workers' Registry) pass through untouched.
    """

    def __init__(self, keys: ApiKeys, protected: Sequence[str]) -> None:
        self._keys = keys
        self._prefixes = tuple(f"/{name}/" for name in protected)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or not details.method.startswith(self._prefixes):
            return handler
        metadata = dict(details.invocation_metadata or ())
        value = metadata.get("authorization")
        if self._keys.allows(value if isinstance(value, str) else None):
            return handler
        return refusing(handler, _REFUSAL)


_REFUSAL = "missing or invalid API key (metadata 'authorization: Bearer <key>')"
