"""A decode worker's KV endpoint as its reservation states it, parsed for a sender (both
pushes: a prefill worker's, and a decode worker's live move)."""

from __future__ import annotations

from tandem.kv_transfer import ConfigError, Endpoint


def parse_endpoint(text: str) -> Endpoint:
    """A decode worker's KV endpoint: ``Endpoint.encode()`` output, or a bare TCP ``host:port``.
    Raises ``ConfigError``."""
    if "|" in text:
        return Endpoint.decode(text)
    if not text:
        raise ConfigError("empty KV endpoint")
    return Endpoint("remote", (("tcp", text),))
