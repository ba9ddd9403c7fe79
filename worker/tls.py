"""TLS for a worker's gRPC server (both roles): ``--tls-cert --tls-key [--tls-client-ca]``.

With ``--tls-client-ca`` the server requires a client certificate signed by that CA, so only a
router holding one (``--worker-cert``/``--worker-key``) can call the worker: mTLS. With
``--router-ca`` the worker's own registration channel to a TLS router trusts that CA.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import grpc

from common.tls import TlsConfigError, read_pem


def add_tls_args(p: argparse.ArgumentParser) -> None:
    """The worker's TLS flags."""
    p.add_argument("--tls-cert", default="", help="PEM certificate chain for the gRPC port")
    p.add_argument("--tls-key", default="", help="PEM private key of --tls-cert")
    p.add_argument("--tls-client-ca", default="",
                   help="require client certificates signed by this CA (mTLS)")
    p.add_argument("--router-ca", default="",
                   help="CA to trust the router by when registering over TLS")


@dataclass(frozen=True, slots=True)
class ServerTls:
    """The worker's certificate and key, and the CA its clients must be signed by (if any)."""

    cert: bytes
    key: bytes
    client_ca: bytes | None = None

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials; a client certificate is required when ``client_ca`` is set."""
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)],
            root_certificates=self.client_ca,
            require_client_auth=self.client_ca is not None,
        )


def server_tls_from_args(args: argparse.Namespace) -> ServerTls | None:
    """None without ``--tls-cert``; raises TlsConfigError on an incomplete or unreadable set."""
    if not (args.tls_cert or args.tls_key or args.tls_client_ca):
        return None
    if not (args.tls_cert and args.tls_key):
        raise TlsConfigError("--tls-cert and --tls-key are both required for TLS")
    return ServerTls(
        read_pem(args.tls_cert, "--tls-cert"),
        read_pem(args.tls_key, "--tls-key"),
        read_pem(args.tls_client_ca, "--tls-client-ca") if args.tls_client_ca else None,
    )


def router_credentials_from_args(args: argparse.Namespace) -> grpc.ChannelCredentials | None:
    """Channel credentials for registering with a TLS router (``--router-ca``), else None."""
    if not args.router_ca:
        return None
    return grpc.ssl_channel_credentials(root_certificates=read_pem(args.router_ca, "--router-ca"))
