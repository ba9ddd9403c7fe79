"""The one interface every transport implements.

A ``Transport`` listens (receiver) and connects (sender); each connection is a ``Channel`` that
sends and receives frame headers and moves KV payloads its own way:

    protocol (handshake, receiver, sender)          frames as dicts, spans of blocks
    ---------------------------------------- Channel --------------------------------
    tcp / tls / fake : bytes after the header     shm : a segment slot     cuda_ipc : GPU copy

``send`` and ``recv`` are safe to call from several tasks: each frame goes out whole.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from typing import Any

from tandem.kv_transfer.blocks import KvBlocks, RecvSpan, SendSpan
from tandem.kv_transfer.codecs import RAW, Codec
from tandem.kv_transfer.endpoint import Endpoint
from tandem.kv_transfer.frame_mac import SessionKeys
from tandem.kv_transfer.frames import Header
from tandem.kv_transfer.layout import KvLayout

Alive = Callable[[], bool]


def always() -> bool:
    """An ``Alive`` for reads that land in no reservation (headers, scratch)."""
    return True


class Channel(abc.ABC):
    """One connection carrying frames between a sender and a receiver."""

    transport: str = "?"
    peer: str = "?"
    codec: Codec = RAW  # how KV payloads travel here (codecs.py), set by the handshake
    codec_layout: KvLayout | None = None
    # Whether this channel can carry an encoded payload (byte streams between hosts do;
    # shm and CUDA IPC stay on the host, where the bytes are cheaper than the codec).
    takes_codecs: bool = False

    def set_codec(self, codec: Codec, layout: KvLayout) -> None:
        """Encode (sender) or accept (receiver) KV payloads with ``codec`` from now on."""
        self.codec, self.codec_layout = codec, layout

    @property
    @abc.abstractmethod
    def max_payload(self) -> int:
        """The largest KV payload this channel can carry in one frame (receiver side)."""

    @abc.abstractmethod
    async def send(self, header: Header, span: SendSpan | None = None) -> None:
        """Send one frame; with ``span``, a KV frame whose payload is the span's blocks."""

    @abc.abstractmethod
    async def recv(self) -> Header:
        """The next frame's checked header. A KV frame's payload must then be consumed with
        ``recv_payload`` before the next ``recv``."""

    @abc.abstractmethod
    async def recv_payload(self, header: Header, span: RecvSpan | None, alive: Alive) -> bool:
        """Consume the payload of the KV frame ``header``.

        Lands it in ``span`` while ``alive()`` holds: checked after the bytes have arrived and
        immediately before every write into the cache, with no await in between (the fence
        that makes ``Receiver.release`` final). Discards it when ``span`` is None or
        ``alive()`` turns false. Returns True when the payload landed and verified; raises
        ``PayloadChecksumError`` when it landed corrupt (the stream is still in sync).
        """

    @abc.abstractmethod
    def start_macs(self, keys: SessionKeys) -> None:
        """From the next frame on, seal every frame sent and check every frame received with
        ``keys`` (tandem/kv_transfer/frame_mac.py); called by the handshake once both proofs
        have verified. A channel under TLS, which authenticates every byte already, may
        ignore it (both ends of a connection are under TLS or neither is)."""

    def client_hello_extras(self) -> dict[str, Any]:
        """Transport fields the sender adds to its last HELLO (CUDA IPC: its cache handle)."""
        return {}

    def server_setup(self, hello: Header) -> dict[str, Any]:
        """Receiver side, after authentication: act on the sender's extras and return the
        fields for the handshake ACK (shm: creates the segment, whose fd rides with the ACK)."""
        return {}

    def client_setup(self, ack: Header) -> None:
        """Sender side: act on the handshake ACK's transport fields (shm: map the segment)."""
        return None

    @property
    def buffered_bytes(self) -> int:
        """Memory this channel holds beyond the cache (segments, pipe buffers)."""
        return 0

    @abc.abstractmethod
    def close(self) -> None:
        """Close now; pending and later calls raise ``ChannelClosed``. Idempotent."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """True once closed."""


Handler = Callable[[Channel], Awaitable[None]]


class Listener(abc.ABC):
    """A bound, accepting server socket (or fake) for one transport."""

    transport: str
    address: str

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop accepting; connections already handed out are the handler's to close."""


class Transport(abc.ABC):
    """A way to move frames; see the module docstring."""

    name: str

    @abc.abstractmethod
    async def listen(self, handler: Handler, blocks: KvBlocks) -> Listener:
        """Start accepting; each new connection is passed to ``handler`` in its own task."""

    @abc.abstractmethod
    def reaches(self, endpoint: Endpoint, blocks: KvBlocks) -> bool:
        """True when this transport can be used from here to ``endpoint`` with this cache."""

    @abc.abstractmethod
    async def connect(self, address: str, blocks: KvBlocks, timeout: float) -> Channel:
        """Open a channel to ``address`` (raises ``ChannelClosed`` on failure)."""
