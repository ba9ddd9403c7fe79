"""Typed errors raised by kv_transfer.

Three families: the local API was misused (``ReservationError``, ``TransferSpecError``,
``ConfigError``), the peer broke the protocol or was refused at HELLO (``ProtocolError``,
``HandshakeError``), or one transfer did not commit (``TransferFailed`` and its subclasses,
each carrying the transfer id and the NACK-style ``code``).
"""

from __future__ import annotations


class KvTransferError(Exception):
    """Base class of every error kv_transfer raises on purpose."""


class ConfigError(KvTransferError, ValueError):
    """A configuration value is out of range."""


class ReservationError(KvTransferError, ValueError):
    """``reserve`` was given a duplicate id, out-of-range or already-held block ids."""


class TransferSpecError(KvTransferError, ValueError):
    """A sender call named layers or block ids that do not fit the cache."""


# -- the wire ---------------------------------------------------------------------------------


class ChannelClosed(KvTransferError, ConnectionError):
    """The connection ended (EOF, reset, or closed locally)."""


class NoRouteError(KvTransferError):
    """No configured transport can reach the endpoint."""


class ProtocolError(KvTransferError):
    """The peer sent something the protocol forbids; the connection is closed."""

    code = "bad_frame"


class FrameTooLarge(ProtocolError):
    """A length prefix or payload size is over the configured limit."""


class MalformedFrame(ProtocolError):
    """A header is not valid msgpack, not a map, or a field is missing or mistyped."""


class UnknownFrameKind(ProtocolError):
    """A header names a kind this protocol version does not have."""


class OutsideReservation(ProtocolError):
    """A KV frame names blocks or a shape that the reservation does not cover."""

    code = "outside_reservation"


class FrameAuthError(ProtocolError):
    """A frame's MAC does not verify: tampered, replayed, reordered or not from the peer that
    did the handshake. The connection closes."""

    code = "bad_mac"


class HandshakeError(KvTransferError):
    """HELLO failed; ``code`` is the NACK code sent or received."""

    code = "handshake"


class VersionMismatch(HandshakeError):
    """The peers speak different protocol versions."""

    code = "version"


class LayoutMismatchError(HandshakeError):
    """The peers' cache layouts differ; their KV blocks are not interchangeable."""

    code = "layout"


class AuthenticationError(HandshakeError):
    """A HMAC proof did not verify: the peer does not hold the shared secret."""

    code = "auth"


class PeerBusy(HandshakeError):
    """The receiver is at its connection limit."""

    code = "busy"


# -- one transfer -----------------------------------------------------------------------------


class TransferFailed(KvTransferError):
    """A transfer ended without a commit; nothing is held for it on this side any more."""

    code = "failed"

    def __init__(self, transfer_id: str, reason: str, code: str | None = None) -> None:
        super().__init__(f"transfer {transfer_id!r}: {reason}")
        self.transfer_id = transfer_id
        self.reason = reason
        if code is not None:
            self.code = code


class ChecksumMismatch(TransferFailed):
    """The payload's hash did not match: the bytes were corrupted on the way."""

    code = "checksum"


class TransferAborted(TransferFailed):
    """One side aborted the transfer (``by`` is "sender" or "receiver")."""

    code = "aborted"

    def __init__(self, transfer_id: str, reason: str, by: str) -> None:
        super().__init__(transfer_id, reason)
        self.by = by


class TransferRejected(TransferFailed):
    """The receiver NACKed the transfer (unknown id, expired lease, busy, incomplete...)."""

    code = "rejected"


class DeadlineExceeded(TransferFailed):
    """The transfer's deadline passed before it committed."""

    code = "deadline"


class ConnectionLost(TransferFailed):
    """The connection carrying the transfer ended before it committed."""

    code = "connection_lost"


class PayloadChecksumError(KvTransferError):
    """Raised by a channel when a received payload does not hash to its checksum."""


NACK_ERRORS: dict[str, type[HandshakeError]] = {
    cls.code: cls for cls in (VersionMismatch, LayoutMismatchError, AuthenticationError, PeerBusy)
}
