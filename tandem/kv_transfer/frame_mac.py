"""Per-frame MACs after the handshake: every frame is authenticated, in order, once.

    session keys (both sides, after the proofs): k_dir = HMAC-SHA256(secret, label_dir |
        nonce_s | nonce_r | fingerprint), one key per direction (sender->receiver, back);
        k_pay = HMAC-SHA256(k_dir, "P"), the direction's payload key
    each frame, direction's counter seq (0, 1, 2, ... never sent):
        | u32 H | header | tag_h | payload? | tag_p? |
        tag_h = HMAC-SHA256(k_dir, "H" | seq | u32 H | header)[:16]   checked before the
                                                                        header is parsed
        tag_p = AES-256-GMAC(k_pay, nonce = u32 0 | u64 seq, tag_h | payload)
                                                                        checked before the
                                                                        payload counts

The counter is implicit: a frame replayed, reordered, dropped or reflected back fails its tag
(a different seq or a different direction's key). A failed tag is a ``FrameAuthError``: the
connection closes and every transfer bound to it ends.

Why GMAC for payloads: a KV payload is megabytes and its tag is computed where the bytes are
already hot (the staging chunk just gathered or just received), so its speed adds straight to
the transfer's CPU cost. AES-GMAC (AES-GCM with the payload as associated data and no
plaintext; NIST SP 800-38D, RFC 4543) runs on the CPU's carry-less multiply at 25-30 GB/s on
the development VM, 2.5x Poly1305 and 15x HMAC-SHA256 (bench/transfer/frame_mac.py measures
them on the machine at hand). GMAC needs a nonce that never repeats under one key: the
frame's seq, which never repeats within a connection, and keys are fresh per connection (both
handshake nonces go into them). Headers are small and keep HMAC-SHA256.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

TAG_BYTES = 16
_SEQ = struct.Struct(">Q")
_NONCE = struct.Struct(">IQ")  # 96-bit GCM nonce: zero, then the frame's seq
_S2R, _R2S = b"tandem-kv/4/frames/sender-to-receiver", b"tandem-kv/4/frames/receiver-to-sender"


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
    """One direction's keys and frame counter."""

    __slots__ = ("_key", "_pay", "_seq")

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._pay = hmac.new(key, b"P", hashlib.sha256).digest()
        self._seq = 0

    def begin(self, head: bytes | bytearray | memoryview) -> FrameSeal:
        """The MACs of the next frame, whose length prefix and header are ``head``. Each call
        is the next frame."""
        seal = FrameSeal(self._key, self._pay, self._seq, head)
        self._seq += 1
        return seal


class FrameSeal:
    """One frame's tags: ``header_tag`` at once; the payload's as it is fed to ``update``."""

    __slots__ = ("_gmac", "_pay", "_seq", "header_tag")

    def __init__(self, key: bytes, pay: bytes, seq: int,
                 head: bytes | bytearray | memoryview) -> None:
        self._pay = pay
        self._seq = seq
        mac = hmac.new(key, b"H" + _SEQ.pack(seq), hashlib.sha256)
        mac.update(head)
        self.header_tag = mac.digest()[:TAG_BYTES]
        self._gmac: Any = None

    def update(self, data: Any) -> None:
        """Feed the next payload bytes (any contiguous buffer: bytes, memoryview, numpy)."""
        if self._gmac is None:
            nonce = _NONCE.pack(0, self._seq)
            self._gmac = Cipher(algorithms.AES(self._pay), modes.GCM(nonce)).encryptor()
            self._gmac.authenticate_additional_data(self.header_tag)  # bound to its header
        self._gmac.authenticate_additional_data(data)

    def payload_tag(self) -> bytes:
        """The tag of the payload fed so far (call once, at its end)."""
        if self._gmac is None:
            self.update(b"")
        self._gmac.finalize()
        tag: bytes = self._gmac.tag
        return tag


def same(tag: bytes | bytearray, expected: bytes) -> bool:
    """Constant-time tag comparison."""
    return hmac.compare_digest(bytes(tag), expected)
