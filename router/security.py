"""The router's secrets, read from the files its config names: API keys and TLS material.

Loaded once, before anything binds, so a bad file is a clear startup error (exit 2) rather
than a refused connection later.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.auth import ApiKeys
from router.config import RouterConfig
from router.tls import ServerTls, WorkerTls


@dataclass(frozen=True, slots=True)
class RouterSecurity:
    """API keys (None: open), public TLS (None: plaintext), worker mTLS (None: plaintext)."""

    keys: ApiKeys | None = None
    server_tls: ServerTls | None = None
    worker_tls: WorkerTls | None = None

    @classmethod
    def from_config(cls, config: RouterConfig) -> RouterSecurity:
        """Read every file ``config`` names; raises ApiKeyFileError or TlsConfigError."""
        return cls(
            ApiKeys.from_file(config.api_key_file) if config.api_key_file else None,
            ServerTls.load(config.tls_cert, config.tls_key),
            WorkerTls.load(config.worker_ca, config.worker_cert, config.worker_key),
        )
