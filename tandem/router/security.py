"""The router's secrets, read from the files its config names: the cluster credential, API
keys and TLS material.

Loaded once, before anything binds, so a bad file is a clear startup error (exit 2) rather
than a refused connection later.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.common.security.credential import ClusterCredential, credential_from_flags
from tandem.common.security.grpc_auth import is_loopback
from tandem.router.auth import ApiKeyFileError, ApiKeys
from tandem.router.config import RouterConfig
from tandem.router.tls import ServerTls, WorkerTls


class UnauthenticatedBindError(ValueError):
    """The public API would be open to a network without API keys, and nobody said so."""


def _public_hosts(config: RouterConfig) -> list[str]:
    hosts = [config.host]
    if config.http_enabled:
        hosts.append(config.http_host or config.host)
    return hosts


@dataclass(frozen=True, slots=True)
class RouterSecurity:
    """The cluster credential (Registry calls in, every worker call out), API keys (None:
    open), public TLS (None: plaintext), worker mTLS (None: plaintext), and the keys that
    open /metrics only (None: /metrics follows the API keys)."""

    credential: ClusterCredential
    keys: ApiKeys | None = None
    server_tls: ServerTls | None = None
    worker_tls: WorkerTls | None = None
    metrics_keys: ApiKeys | None = None
    admin_keys: ApiKeys | None = None  # open the admin routes only (runtime LoRA updates)

    @classmethod
    def from_config(cls, config: RouterConfig) -> RouterSecurity:
        """Read every file ``config`` names; raises CredentialError (none given, or an
        unusable file), ApiKeyFileError, TlsConfigError, or UnauthenticatedBindError (the
        public API on a non-loopback address without keys, unless allowed)."""
        if not (config.api_key_file or config.api_keys) and not config.allow_unauthenticated:
            public = [h for h in _public_hosts(config) if not is_loopback(h)]
            if public:
                raise UnauthenticatedBindError(
                    f"the public API would listen on {public[0]!r} without API keys: pass "
                    "--api-key-file or --api-key, or --allow-unauthenticated if that network "
                    "is trusted")
        return cls(
            credential_from_flags(config.cluster_secret_file or None, config.insecure, "router"),
            ApiKeys.load(config.api_key_file, config.api_keys),
            ServerTls.load(config.tls_cert, config.tls_key),
            WorkerTls.load(config.worker_ca, config.worker_cert, config.worker_key),
            ApiKeys.load(config.metrics_key_file),
            _admin_keys(config),
        )


def _admin_keys(config: RouterConfig) -> ApiKeys | None:
    """The admin keys; runtime LoRA updates without any are refused (no open admin API)."""
    keys = ApiKeys.load(config.admin_key_file)
    if config.allow_runtime_lora_updates and not keys:
        raise ApiKeyFileError("--allow-runtime-lora-updates needs --admin-key-file (the "
                              "admin routes are never open)")
    return keys
