"""The one configuration both ``tandem.Client`` and ``tandem.AsyncClient`` take.

Frozen and validated when built, so a typo in a path or a negative timeout fails at
construction, not on the first call.

Environment defaults (for clients only; server processes never read configuration from the
environment): ``TANDEM_TARGET`` (the router's gRPC ``host:port``) and ``TANDEM_API_KEY``
fill ``target`` and ``api_key`` when the caller gives neither a ``config`` nor that field.
Explicit always wins, an explicit ``None`` included (``Client(api_key=None)`` sends no key
whatever the environment says); a ``ClientConfig`` passed in is used as built (its defaults
are constants, never the environment: ``ClientConfig.from_env()`` is the way to ask for
them). The key is never shown: not in ``repr``, not in an error message.
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from tandem.sdk.retry import RetryPolicy

DEFAULT_TARGET = "127.0.0.1:50051"  # the router's default gRPC port, on loopback
TARGET_ENV = "TANDEM_TARGET"
API_KEY_ENV = "TANDEM_API_KEY"


@dataclass(frozen=True, slots=True)
class TLSConfig:
    """TLS to the router: ``ca_cert`` verifies the server (None: the system roots);
    ``client_cert`` + ``client_key`` present a client certificate (mTLS);
    ``server_name`` overrides the name checked against the server's certificate."""

    ca_cert: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("tls: client_cert and client_key go together (mTLS)")
        for name in ("ca_cert", "client_cert", "client_key"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"tls.{name}: no such file {path!r}")
        if self.server_name is not None and not self.server_name:
            raise ValueError("tls.server_name must not be empty")

    def read(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """(CA bundle, client key, client certificate chain) as PEM bytes."""
        def load(path: str | None) -> bytes | None:
            return Path(path).read_bytes() if path is not None else None

        return load(self.ca_cert), load(self.client_key), load(self.client_cert)


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Where the router is and how to talk to it.

    ``target``: ``host:port`` (any gRPC target string). ``api_key``: sent as
    ``authorization: Bearer <key>`` on every call. ``timeout_s``: the default deadline of a
    call, retries included (None: no deadline). ``keepalive_s``: HTTP/2 ping interval on an
    idle connection, so a dead peer is noticed (None: no pings). ``retry``: the backoff policy.
    """

    target: str = DEFAULT_TARGET
    tls: TLSConfig | None = None
    api_key: str | None = field(default=None, repr=False)  # a secret: never in a repr
    timeout_s: float | None = 600.0
    keepalive_s: float | None = 30.0
    keepalive_timeout_s: float = 10.0
    max_message_bytes: int = 64 * 1024 * 1024
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if not self.target or any(c.isspace() for c in self.target):
            raise ValueError(f"target must be a non-empty host:port, got {self.target!r}")
        if self.api_key is not None:
            if not self.api_key:
                raise ValueError("api_key must not be empty (use None for no key)")
            # gRPC metadata values are printable ASCII; anything else could never authenticate.
            if not all(33 <= ord(c) <= 126 for c in self.api_key):
                raise ValueError("api_key must be printable ASCII without spaces")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError("timeout_s must be > 0 (or None for no deadline)")
        if self.keepalive_s is not None and not (
            self.keepalive_s > 0 and math.isfinite(self.keepalive_s)
        ):
            raise ValueError("keepalive_s must be > 0 (or None for no pings)")
        if not (self.keepalive_timeout_s > 0 and math.isfinite(self.keepalive_timeout_s)):
            raise ValueError("keepalive_timeout_s must be > 0")
        if self.max_message_bytes < 1024:
            raise ValueError("max_message_bytes must be >= 1024")
        if not isinstance(self.retry, RetryPolicy):
            raise ValueError("retry must be a RetryPolicy")

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **fields: object
    ) -> ClientConfig:
        """The defaults with ``TANDEM_TARGET`` / ``TANDEM_API_KEY`` applied (unset or empty:
        not applied), then ``fields`` on top (explicit wins). ``environ``: os.environ."""
        env = env_fields(os.environ if environ is None else environ, skip=fields)
        return cls(**{**env, **fields})  # type: ignore[arg-type]


def env_fields(environ: Mapping[str, str], skip: Collection[str] = ()) -> dict[str, str]:
    """``target`` and ``api_key`` from the environment, except the fields in ``skip`` (given
    explicitly: their variables are not even read). Checked here so a bad value names its
    variable; a bad key's value is not repeated (it may be a near-miss of the real one)."""
    out: dict[str, str] = {}
    target = "" if "target" in skip else environ.get(TARGET_ENV, "").strip()
    if target:
        if any(c.isspace() for c in target):
            raise ValueError(f"{TARGET_ENV} must be a host:port, got {target!r}")
        out["target"] = target
    key = "" if "api_key" in skip else environ.get(API_KEY_ENV, "").strip()
    if key:
        if not all(33 <= ord(c) <= 126 for c in key):
            raise ValueError(f"{API_KEY_ENV} must be printable ASCII without spaces")
        out["api_key"] = key
    return out


def resolve_config(
    target: str | None, config: ClientConfig | None, overrides: dict[str, object]
) -> ClientConfig:
    """``config`` (or, without one, the defaults with the environment's ``TANDEM_TARGET``
    and ``TANDEM_API_KEY``) with ``target`` and any field overrides applied on top."""
    if target is not None:
        overrides = {**overrides, "target": target}
    unknown = sorted(set(overrides) - set(ClientConfig.__dataclass_fields__))
    if unknown:
        raise TypeError(f"unknown client option(s): {', '.join(unknown)}")
    if config is None:
        return ClientConfig.from_env(**overrides)
    return replace(config, **overrides) if overrides else config  # type: ignore[arg-type]


def call_timeout(config: ClientConfig, timeout: float | None) -> float | None:
    """A call's deadline in seconds: ``timeout`` if given (inf: none), else the default."""
    if timeout is None:
        return config.timeout_s
    if not timeout > 0:
        raise ValueError("timeout must be > 0")
    return None if math.isinf(timeout) else timeout
