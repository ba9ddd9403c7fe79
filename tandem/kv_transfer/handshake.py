"""HELLO: mutual HMAC authentication, version and layout check (docs/kv_transfer.md section 3).

    S -> R  HELLO {version, layout, fingerprint, nonce_s, transport}
    R -> S  HELLO {version, fingerprint, nonce_r, max_payload, keepalive_ms, proof_r}
                                                                           or NACK, close
    S -> R  HELLO {proof_s, transport extras}
    R -> S  ACK   {ref: HELLO, transport extras}                           or NACK, close

Each side proves it holds the secret over both nonces and the fingerprint; the labels differ
per role so a proof cannot be reflected back.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from tandem.kv_transfer.errors import (
    NACK_ERRORS,
    AuthenticationError,
    ChannelClosed,
    HandshakeError,
    LayoutMismatchError,
    MalformedFrame,
    VersionMismatch,
)
from tandem.kv_transfer.frames import PROTOCOL_VERSION, Header, Kind, ack, nack
from tandem.kv_transfer.layout import KvLayout
from tandem.kv_transfer.transport.base import Channel

NONCE_BYTES = 16
# What a sender accepts as the receiver's KEEPALIVE interval (a bad value cannot make it spin).
MIN_KEEPALIVE_S, MAX_KEEPALIVE_S = 0.01, 3600.0
_SENDER_LABEL = b"tandem-kv/1/sender"
_RECEIVER_LABEL = b"tandem-kv/1/receiver"


def proof(secret: bytes, label: bytes, nonce_a: bytes, nonce_b: bytes, fingerprint: str) -> bytes:
    """HMAC-SHA256 over a role label, both nonces and the layout fingerprint."""
    msg = label + nonce_a + nonce_b + fingerprint.encode()
    return hmac.new(secret, msg, hashlib.sha256).digest()


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """What the sender learns from the receiver's HELLO."""

    max_payload: int
    keepalive_s: float  # send a KEEPALIVE for a bound transfer quiet for this long


def _expect(header: Header, kind: Kind, step: str) -> Header:
    if header["kind"] == Kind.NACK:
        error = NACK_ERRORS.get(header["code"], HandshakeError)
        raise error(f"refused by peer at {step}: {header['code']}: {header.get('reason', '')}")
    if header["kind"] != kind:
        raise MalformedFrame(f"expected {kind.name} at {step}, got {Kind(header['kind']).name}")
    return header


def _bytes(header: Header, name: str) -> bytes:
    value = header.get(name)
    if type(value) is not bytes:
        raise MalformedFrame(f"HELLO lacks {name!r}")
    return value


def _int(header: Header, name: str) -> int:
    value = header.get(name)
    if type(value) is not int:
        raise MalformedFrame(f"HELLO lacks {name!r}")
    return value


async def client_handshake(ch: Channel, layout: KvLayout, secret: bytes) -> PeerInfo:
    """Sender side. Raises a ``HandshakeError`` subclass (or ``ChannelClosed``) on refusal."""
    nonce_s = secrets.token_bytes(NONCE_BYTES)
    fp = layout.fingerprint
    await ch.send({"kind": Kind.HELLO, "version": PROTOCOL_VERSION, "layout": layout.to_wire(),
                   "fingerprint": fp, "nonce": nonce_s, "transport": ch.transport})
    hello = _expect(await ch.recv(), Kind.HELLO, "HELLO")
    if hello.get("version") != PROTOCOL_VERSION:
        raise VersionMismatch(f"receiver speaks version {hello.get('version')}")
    nonce_r = _bytes(hello, "nonce")
    max_payload = _int(hello, "max_payload")
    keepalive_s = min(max(_int(hello, "keepalive_ms") / 1000, MIN_KEEPALIVE_S), MAX_KEEPALIVE_S)
    proof_r = _bytes(hello, "proof")
    if hello.get("fingerprint") != fp:
        raise LayoutMismatchError(f"receiver layout {hello.get('fingerprint')} != {fp}")
    if not hmac.compare_digest(proof_r, proof(secret, _RECEIVER_LABEL, nonce_s, nonce_r, fp)):
        raise AuthenticationError("receiver's proof does not verify: wrong secret")
    await ch.send({"kind": Kind.HELLO, "proof": proof(secret, _SENDER_LABEL, nonce_r, nonce_s, fp),
                   **ch.client_hello_extras()})
    done = _expect(await ch.recv(), Kind.ACK, "ACK")
    ch.client_setup(done)
    return PeerInfo(max_payload=max_payload, keepalive_s=keepalive_s)


async def server_handshake(ch: Channel, layout: KvLayout, secret: bytes,
                           keepalive_s: float) -> None:
    """Receiver side; ``keepalive_s`` is the KEEPALIVE interval asked of the sender. On refusal
    sends a NACK, then raises the matching ``HandshakeError``."""
    fp = layout.fingerprint
    try:
        hello = _expect(await ch.recv(), Kind.HELLO, "HELLO")
        if hello.get("version") != PROTOCOL_VERSION:
            raise VersionMismatch(f"sender speaks version {hello.get('version')}, "
                                  f"we speak {PROTOCOL_VERSION}")
        nonce_s = _bytes(hello, "nonce")
        if len(nonce_s) != NONCE_BYTES:
            raise MalformedFrame("HELLO nonce has the wrong length")
        layout.check_compatible(KvLayout.from_wire(hello.get("layout")))
        nonce_r = secrets.token_bytes(NONCE_BYTES)
        await ch.send({"kind": Kind.HELLO, "version": PROTOCOL_VERSION, "fingerprint": fp,
                       "nonce": nonce_r, "max_payload": ch.max_payload,
                       "keepalive_ms": max(1, int(keepalive_s * 1000)),
                       "proof": proof(secret, _RECEIVER_LABEL, nonce_s, nonce_r, fp)})
        final = _expect(await ch.recv(), Kind.HELLO, "proof")
        proof_s = _bytes(final, "proof")
        if not hmac.compare_digest(proof_s, proof(secret, _SENDER_LABEL, nonce_r, nonce_s, fp)):
            raise AuthenticationError("sender's proof does not verify: wrong secret")
        extras = ch.server_setup(final)
    except HandshakeError as exc:
        await _refuse(ch, exc.code, str(exc))
        raise
    except MalformedFrame as exc:
        await _refuse(ch, exc.code, str(exc))
        raise
    await ch.send(ack(Kind.HELLO, **extras))


async def _refuse(ch: Channel, code: str, reason: str) -> None:
    with contextlib.suppress(ChannelClosed):  # the peer may be gone; the caller closes anyway
        await ch.send(nack(Kind.HELLO, code, reason))
