"""TLS for a worker's gRPC server (both roles): ``--tls-cert --tls-key [--tls-client-ca]``.

With ``--tls-client-ca`` the server requires a client certificate signed by that CA, so only a
router holding one (``--worker-cert``/``--worker-key``) can call the worker: mTLS. With
``--router-ca`` the worker's own registration channel to a TLS router trusts that CA.
``--kv-tls-cert/--kv-tls-key/--kv-tls-ca`` put TLS on the KV transfer's TCP transport.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import grpc

from tandem.common.security.tls import TlsConfigError, read_pem
from tandem.kv_transfer import TlsConfig


def add_tls_args(p: argparse.ArgumentParser) -> None:
    """The worker's TLS flags."""
    p.add_argument("--tls-cert", default="", help="PEM certificate chain for the gRPC port")
    p.add_argument("--tls-key", default="", help="PEM private key of --tls-cert")
    p.add_argument("--tls-client-ca", default="",
                   help="require client certificates signed by this CA (mTLS)")
    p.add_argument("--router-ca", default="",
                   help="CA to trust the router by when registering over TLS")
    p.add_argument("--kv-tls-cert", default="",
                   help="PEM certificate for KV transfers over TCP (decode: served; prefill: "
                   "shown to the decode worker when it asks)")
    p.add_argument("--kv-tls-key", default="", help="PEM private key of --kv-tls-cert")
    p.add_argument("--kv-tls-ca", default="",
                   help="CA the KV peer's certificate must be signed by (both roles)")


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


def kv_tls_from_args(args: argparse.Namespace, role: str) -> TlsConfig | None:
    """TLS on the KV transfer's TCP transport, or None (plaintext, the credential still
    authenticates every connection). A decode worker serves KV, so it needs a certificate; a
    prefill worker needs the CA to check it. Raises TlsConfigError on an incomplete set."""
    cert, key, ca = args.kv_tls_cert, args.kv_tls_key, args.kv_tls_ca
    if not (cert or key or ca):
        return None
    if bool(cert) != bool(key):
        raise TlsConfigError("--kv-tls-cert and --kv-tls-key go together")
    if role == "decode" and not cert:
        raise TlsConfigError("a decode worker serves KV: KV TLS needs --kv-tls-cert/--kv-tls-key")
    if role == "prefill" and not ca:
        raise TlsConfigError("a prefill worker checks the KV peer: KV TLS needs --kv-tls-ca")
    for path, flag in ((cert, "--kv-tls-cert"), (key, "--kv-tls-key"), (ca, "--kv-tls-ca")):
        if path:
            read_pem(path, flag)  # fail at start, naming the flag
    return TlsConfig(cert_file=cert or None, key_file=key or None, ca_file=ca or None)


def router_credentials_from_args(args: argparse.Namespace) -> grpc.ChannelCredentials | None:
    """Channel credentials for registering with a TLS router (``--router-ca``), else None."""
    if not args.router_ca:
        return None
    return grpc.ssl_channel_credentials(root_certificates=read_pem(args.router_ca, "--router-ca"))
