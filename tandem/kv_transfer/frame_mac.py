"""Per-frame MACs after the handshake: every frame is authenticated, in order, once.

    session keys (both sides, after the proofs): k_dir = HMAC-SHA256(secret, label_dir |
        nonce_s | nonce_r | fingerprint), one key per direction (sender->receiver, back)
    each frame, direction's counter seq (0, 1, 2, ... never sent):
        | u32 H | header | tag_h | payload? | tag_p? |
        tag_h = HMAC(k_dir, seq | u32 H | header | "H")[:16]      checked before the header
                                                                   is even parsed
        tag_p = HMAC(k_dir, seq | u32 H | header | payload | "P")[:16]
                                                                   checked before the payload
                                                                   counts as received

The counter is implicit: a frame replayed, reordered, dropped or reflected back fails its tag
(a different seq or a different direction's key). A failed tag is a ``FrameAuthError``: the
connection closes and every transfer bound to it ends. HMAC-SHA256 runs on OpenSSL (SHA
extensions on current x86 and ARM), faster there than keyed BLAKE2b; the payload is hashed
batch by batch as it is written or read, like the xxh3 checksum it replaces.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass
from typing import Any

TAG_BYTES = 16
_SEQ = struct.Struct(">Q")
_S2R, _R2S = b"tandem-kv/3/frames/sender-to-receiver", b"tandem-kv/3/frames/receiver-to-sender"


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """One connection's frame keys, as one side uses them."""

    send: bytes
    recv: bytes


def session_keys(secret: bytes, nonce_s: bytes, nonce_r: bytes, fingerprint: str,
                 *, sender: bool) -> SessionKeys:
    """The keys of the connection whose handshake exchanged ``nonce_s`` and ``nonce_r``
    (fresh per connection, so no two connections share a key)."""
    tail = nonce_s + nonce_r + fingerprint.encode()
    s2r = hmac.new(secret, _S2R + tail, hashlib.sha256).digest()
    r2s = hmac.new(secret, _R2S + tail, hashlib.sha256).digest()
    return SessionKeys(send=s2r, recv=r2s) if sender else SessionKeys(send=r2s, recv=s2r)


class FrameMac:
    """One direction's key and frame counter."""

    __slots__ = ("_key", "_seq")

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._seq = 0

    def begin(self, head: bytes | bytearray | memoryview) -> Any:
        """The running MAC of the next frame, over its sequence number and ``head`` (the
        length prefix and the header). Each call is the next frame."""
        mac = hmac.new(self._key, _SEQ.pack(self._seq), hashlib.sha256)
        self._seq += 1
        mac.update(head)
        return mac


def header_tag(mac: Any) -> bytes:
    """The tag sent right after the header (``mac`` stays usable for the payload)."""
    head = mac.copy()
    head.update(b"H")
    return head.digest()[:TAG_BYTES]


def payload_tag(mac: Any) -> bytes:
    """The tag sent right after the payload (``mac`` has seen the payload)."""
    mac.update(b"P")
    return mac.digest()[:TAG_BYTES]


def same(tag: bytes | bytearray, expected: bytes) -> bool:
    """Constant-time tag comparison."""
    return hmac.compare_digest(bytes(tag), expected)
