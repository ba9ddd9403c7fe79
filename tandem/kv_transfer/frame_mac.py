"""Per-frame MACs after the handshake: every frame is authenticated, in order, once.

    session keys (both sides, after the proofs): k_dir = HMAC-SHA256(secret, label_dir |
        nonce_s | nonce_r | fingerprint), one key per direction (sender->receiver, back)
    each frame, direction's counter seq (0, 1, 2, ... never sent):
        | u32 H | header | tag_h | payload? | tag_p? |
        tag_h = HMAC-SHA256(k_dir, "H" | seq | u32 H | header)[:16]   checked before the
                                                                        header is parsed
        tag_p = Poly1305(k_p, tag_h | payload), k_p = HMAC-SHA256(k_dir, "P" | seq)
                                                                        checked before the
                                                                        payload counts

The counter is implicit: a frame replayed, reordered, dropped or reflected back fails its tag
(a different seq or a different direction's key). A failed tag is a ``FrameAuthError``: the
connection closes and every transfer bound to it ends.

Why Poly1305 for payloads: a KV payload is megabytes and the tag is computed on the event loop
as the bytes move, so its speed is the transfer's. Poly1305 (OpenSSL, through
``cryptography``) runs at several GB/s where HMAC-SHA256 runs at 1-2 and keyed BLAKE2b at
about 1 (bench/transfer/frame_mac.py measures all three on the machine at hand). It is a
one-time MAC, so each payload gets its own key, derived from the direction's key and the
frame's seq; headers are small and keep HMAC-SHA256.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

from cryptography.hazmat.primitives.poly1305 import Poly1305

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

    def begin(self, head: bytes | bytearray | memoryview) -> FrameSeal:
        """The MACs of the next frame, whose length prefix and header are ``head``. Each call
        is the next frame."""
        seal = FrameSeal(self._key, self._seq, head)
        self._seq += 1
        return seal


class FrameSeal:
    """One frame's tags: ``header_tag`` at once; the payload's as it is fed to ``update``."""

    __slots__ = ("_key", "_poly", "_seq", "header_tag")

    def __init__(self, key: bytes, seq: int, head: bytes | bytearray | memoryview) -> None:
        self._key = key
        self._seq = _SEQ.pack(seq)
        mac = hmac.new(key, b"H" + self._seq, hashlib.sha256)
        mac.update(head)
        self.header_tag = mac.digest()[:TAG_BYTES]
        self._poly: Poly1305 | None = None

    def update(self, data: bytes | bytearray | memoryview) -> None:
        """Feed the next payload bytes."""
        if self._poly is None:
            one_time = hmac.new(self._key, b"P" + self._seq, hashlib.sha256).digest()
            self._poly = Poly1305(one_time)
            self._poly.update(self.header_tag)  # the payload is bound to its header
        self._poly.update(data)

    def payload_tag(self) -> bytes:
        """The tag of the payload fed so far (call once, at its end)."""
        if self._poly is None:
            self.update(b"")
        assert self._poly is not None
        return self._poly.finalize()


def same(tag: bytes | bytearray, expected: bytes) -> bool:
    """Constant-time tag comparison."""
    return hmac.compare_digest(bytes(tag), expected)
