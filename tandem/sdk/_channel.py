"""Channels, credentials and call metadata shared by the sync and async clients."""

from __future__ import annotations

import grpc

from tandem.common.wire import REQUEST_ID_KEY
from tandem.sdk.client_config import ClientConfig

Metadata = tuple[tuple[str, str], ...]


def channel_options(config: ClientConfig) -> list[tuple[str, int | str]]:
    """gRPC channel arguments: message size limits, keepalive pings, TLS name override."""
    options: list[tuple[str, int | str]] = [
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.max_receive_message_length", config.max_message_bytes),
    ]
    if config.keepalive_s is not None:
        options += [
            ("grpc.keepalive_time_ms", int(config.keepalive_s * 1000)),
            ("grpc.keepalive_timeout_ms", int(config.keepalive_timeout_s * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ]
    if config.tls is not None and config.tls.server_name is not None:
        options.append(("grpc.ssl_target_name_override", config.tls.server_name))
    return options


def channel_credentials(config: ClientConfig) -> grpc.ChannelCredentials | None:
    """TLS (or mTLS) credentials, or None for a plaintext channel."""
    if config.tls is None:
        return None
    ca, key, chain = config.tls.read()
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=chain
    )


def call_metadata(config: ClientConfig) -> Metadata:
    """Metadata sent on every call: the API key as a bearer token, when set."""
    if config.api_key is None:
        return ()
    return (("authorization", f"Bearer {config.api_key}"),)


def generate_metadata(base: Metadata, request_id: str) -> Metadata:
    """A Generate call's metadata: ``base`` plus ``x-request-id`` when the caller named its
    request. The router reads ``GenerateRequest.request_id`` first; the metadata is what a
    proxy or gateway in between (access logs, Envoy's request id) sees. An id gRPC metadata
    cannot carry (anything but printable ASCII without spaces) travels in the field alone,
    where the router refuses it with INVALID_ARGUMENT as it refuses any malformed id."""
    if not request_id or not all(33 <= ord(c) <= 126 for c in request_id):
        return base
    return (*base, (REQUEST_ID_KEY, request_id))


def sync_channel(config: ClientConfig) -> grpc.Channel:
    """A blocking channel to ``config.target``."""
    creds = channel_credentials(config)
    options = channel_options(config)
    if creds is None:
        return grpc.insecure_channel(config.target, options=options)
    return grpc.secure_channel(config.target, creds, options=options)


def aio_channel(config: ClientConfig) -> grpc.aio.Channel:
    """An asyncio channel to ``config.target`` (create it inside the running loop)."""
    creds = channel_credentials(config)
    options = channel_options(config)
    if creds is None:
        return grpc.aio.insecure_channel(config.target, options=options)
    return grpc.aio.secure_channel(config.target, creds, options=options)
