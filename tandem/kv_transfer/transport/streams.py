"""A channel over asyncio streams: what TLS uses.

TLS encrypts (and so copies) every byte anyway, so the one extra copy through the stream
buffers costs little; plain TCP uses ``SocketChannel`` instead. TLS authenticates every byte
(AEAD records), so frames here carry neither frame MACs nor a checksum.
"""

from __future__ import annotations

import asyncio

from tandem.kv_transfer.errors import ChannelClosed
from tandem.kv_transfer.frame_mac import SessionKeys
from tandem.kv_transfer.frames import HeaderCodec
from tandem.kv_transfer.transport.base import Alive, always
from tandem.kv_transfer.transport.byte_channel import ByteChannel, IoVec

READ_CHUNK = 256 << 10


class StreamChannel(ByteChannel):
    """``ByteChannel`` over an ``asyncio.StreamReader``/``StreamWriter`` pair."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 codec: HeaderCodec, max_payload: int, transport: str, peer: str) -> None:
        super().__init__(codec, max_payload, transport, peer)
        self._reader = reader
        self._writer = writer

    async def _write(self, iov: IoVec) -> None:
        self._check_open()
        try:
            # Copied: the caller reuses its staging chunk once this returns, and the TLS
            # transport may hold on to what it was given (it copies to encrypt anyway).
            self._writer.writelines([bytes(b) for b in iov.head(len(iov.bufs))])
            iov.consume(iov.remaining)
            await self._writer.drain()
        except (OSError, RuntimeError) as exc:
            raise ChannelClosed(f"send to {self.peer}: {exc}") from exc

    async def _read_some(self, iov: IoVec, alive: Alive = always) -> int:
        self._check_open()
        if not alive():
            return 0
        try:
            data = await self._reader.read(min(iov.remaining, READ_CHUNK))
        except OSError as exc:
            raise ChannelClosed(f"recv from {self.peer}: {exc}") from exc
        if not data:
            raise ChannelClosed(f"{self.peer} closed the connection")
        if not alive():  # the fence: the bytes are here; they go nowhere
            return len(data)
        return iov.fill_from(data)

    def start_macs(self, keys: SessionKeys) -> None:
        """TLS authenticates (and encrypts) every byte already: frames stay as they are."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._writer.transport.abort()
