"""TLS for the router: its public ports (gRPC and HTTP) and, optionally, mTLS to workers.

    client ──TLS──> router (:50051 gRPC, :8000 HTTP)      --tls-cert/--tls-key
    router ──mTLS──> workers                              --worker-ca/--worker-cert/--worker-key

Files are read once at startup (``tandem.common.security.tls.read_pem``); a missing or unreadable one is a
``tandem.common.security.tls.TlsConfigError`` (exit 2).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

import grpc

from tandem.common.security.tls import TlsConfigError, read_pem


@dataclass(frozen=True, slots=True)
class ServerTls:
    """A certificate chain and private key to serve TLS with (paths kept for ssl.SSLContext)."""

    cert_path: str
    key_path: str
    cert: bytes
    key: bytes

    @classmethod
    def load(cls, cert: str, key: str) -> ServerTls | None:
        """None when neither is given; both or neither, else TlsConfigError."""
        if not cert and not key:
            return None
        if not cert or not key:
            raise TlsConfigError("--tls-cert and --tls-key go together")
        return cls(cert, key, read_pem(cert, "--tls-cert"), read_pem(key, "--tls-key"))

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """Server credentials for the public gRPC port (no client certificate asked)."""
        return grpc.ssl_server_credentials([(self.key, self.cert)])

    def ssl_context(self) -> ssl.SSLContext:
        """An SSL context for the HTTP port."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.cert_path, self.key_path)
        except (OSError, ssl.SSLError) as err:
            raise TlsConfigError(f"--tls-cert/--tls-key do not load: {err}") from err
        return context


@dataclass(frozen=True, slots=True)
class WorkerTls:
    """What the router presents to workers (mTLS) and the CA it trusts them by."""

    ca: bytes
    cert: bytes | None = None
    key: bytes | None = None

    @classmethod
    def load(cls, ca: str, cert: str, key: str) -> WorkerTls | None:
        """None when no worker flag is given; ``--worker-ca`` is required with any of them."""
        if not (ca or cert or key):
            return None
        if not ca:
            raise TlsConfigError("--worker-ca is required with --worker-cert/--worker-key")
        if bool(cert) != bool(key):
            raise TlsConfigError("--worker-cert and --worker-key go together")
        return cls(
            read_pem(ca, "--worker-ca"),
            read_pem(cert, "--worker-cert") if cert else None,
            read_pem(key, "--worker-key") if key else None,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Channel credentials for every worker channel."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )
