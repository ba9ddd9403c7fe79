"""Framing over a byte stream, shared by the TCP, TLS, Unix-socket and fake channels.

    sealed (after ``start_macs``, frame_mac.py):   | u32 H | header | tag_h | payload | tag_p |
    unsealed (handshake frames, and TLS, which authenticates every byte itself):
                                                   | u32 H | header | payload |
        tag_h is checked before the header is parsed; tag_p before the payload counts as
        landed (a payload that is discarded, its reservation gone, is never used, so its
        bytes are not checked; the authenticated header says how many to skip)

Payloads move through one staging chunk per direction (``CHUNK_BYTES``, whole rows): the
sender gathers the next rows of the frame into it (one ``np.take``), feeds it to the MAC while
it is hot and writes it with one call; the receiver reads the next chunk into it, feeds it to
the MAC, and scatters it into the reserved blocks (one numpy assignment). A fragmented cache
then costs one memory pass per side beyond the socket's own copy, with no per-block Python.
A frame under a codec (codecs.py, negotiated at HELLO) is encoded whole, its wire bytes
MAC'd and sent; the receiver checks the MAC before it decodes a byte.

Subclasses supply two primitives: ``_write`` (drain an ``IoVec``; the buffers may be reused
once it returns) and ``_read_some`` (fill at least one byte of an ``IoVec``'s head).

The fence: ``recv_payload`` takes the reservation's ``alive`` and checks it after each chunk
has arrived and immediately before that chunk is written into the cache, with no await in
between. A payload whose reservation ends mid-way is read on into scratch and dropped, so the
stream stays in sync.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Iterable

import numpy as np

from tandem.kv_transfer.blocks import Buffer, RecvSpan, SendSpan, chunk_bytes
from tandem.kv_transfer.codecs import RAW
from tandem.kv_transfer.errors import (
    ChannelClosed,
    FrameAuthError,
    FrameTooLarge,
    MalformedFrame,
)
from tandem.kv_transfer.frame_mac import TAG_BYTES, FrameMac, FrameSeal, SessionKeys, same
from tandem.kv_transfer.frames import PREFIX, Header, HeaderCodec, encode_header
from tandem.kv_transfer.transport.base import Alive, Channel, always

IOV_MAX = 1024  # Linux UIO_MAXIOV: buffers per sendmsg / recvmsg_into call
SCRATCH_BYTES = 64 << 10


class IoVec:
    """A list of buffers being drained (send) or filled (receive), with a cursor."""

    __slots__ = ("bufs", "i", "remaining")

    def __init__(self, bufs: list[Buffer], total: int | None = None) -> None:
        self.bufs = bufs
        self.i = 0
        self.remaining = sum(b.nbytes for b in bufs) if total is None else total

    def head(self, max_iov: int = IOV_MAX) -> list[Buffer]:
        """The next buffers, at most ``max_iov`` of them."""
        return self.bufs[self.i:self.i + max_iov]

    def consume(self, n: int) -> None:
        """Advance the cursor by ``n`` bytes."""
        self.remaining -= n
        bufs = self.bufs
        i = self.i
        while n:
            size = bufs[i].nbytes
            if n >= size:
                n -= size
                i += 1
            else:
                bufs[i] = bufs[i][n:]
                n = 0
        self.i = i

    def fill_from(self, data: bytes | memoryview) -> int:
        """Copy ``data`` into the head buffers (no consume); returns bytes copied."""
        src = memoryview(data)
        done = 0
        for b in self.bufs[self.i:]:
            if done == src.nbytes:
                break
            k = min(b.nbytes, src.nbytes - done)
            b[:k] = src[done:done + k]
            done += k
        return done


class ByteChannel(Channel):
    """A ``Channel`` whose payloads travel on the stream after their header."""

    takes_codecs = True

    def __init__(self, codec: HeaderCodec, max_payload: int, transport: str, peer: str) -> None:
        self._codec = codec
        self._max_payload = max_payload
        self.transport = transport
        self.peer = peer
        self._wlock = asyncio.Lock()
        self._closed = False
        self._scratch: memoryview | None = None
        self._tx: FrameMac | None = None  # set by start_macs
        self._rx: FrameMac | None = None
        self._rx_mac: FrameSeal | None = None  # the seal of the last KV header received
        self._tx_chunk: np.ndarray | None = None  # staging chunks, one per direction
        self._rx_chunk: np.ndarray | None = None

    # -- primitives ---------------------------------------------------------------------------

    @abc.abstractmethod
    async def _write(self, iov: IoVec) -> None:
        """Write every remaining byte of ``iov``."""

    @abc.abstractmethod
    async def _read_some(self, iov: IoVec, alive: Alive = always) -> int:
        """Wait for bytes; then, if ``alive()`` still holds (checked after the wait, with no
        await before the write), read at least one into ``iov.head()``. Returns how many bytes
        were taken off the stream (not consumed from ``iov``); they are in ``iov`` only if
        ``alive()`` holds when this returns (it never turns true again once false)."""

    # -- shared -------------------------------------------------------------------------------

    @property
    def max_payload(self) -> int:
        return self._max_payload

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def buffered_bytes(self) -> int:
        """The staging chunks (one per direction, once used)."""
        return sum(c.nbytes for c in (self._tx_chunk, self._rx_chunk) if c is not None)

    def start_macs(self, keys: SessionKeys) -> None:
        self._tx, self._rx = FrameMac(keys.send), FrameMac(keys.recv)

    @property
    def sealed(self) -> bool:
        """Whether frames carry MACs now (after the handshake, not under TLS)."""
        return self._tx is not None

    def _seal(self, header: Header) -> tuple[bytes, FrameSeal | None]:
        """A header frame's bytes (prefix, map, and its tag once sealed) and its running MAC
        (None before ``start_macs``). Call under the write lock: it takes the next seq."""
        head = encode_header(header)
        if self._tx is None:
            return head, None
        mac = self._tx.begin(head)
        return head + mac.header_tag, mac

    def _check_open(self) -> None:
        if self._closed:
            raise ChannelClosed(f"{self.transport} channel to {self.peer} is closed")

    async def _read_exact(self, n: int) -> bytearray:
        buf = bytearray(n)
        iov = IoVec([memoryview(buf)], n)
        while iov.remaining:
            iov.consume(await self._read_some(iov))
        return buf

    async def _fill(self, iov: IoVec, alive: Alive = always) -> bool:
        """Fill ``iov``; if ``alive()`` turns false first, discard the rest and return False."""
        while iov.remaining:
            n = await self._read_some(iov, alive)
            if not alive():  # fenced: those n bytes were taken off the stream, not written
                await self._discard(iov.remaining - n)
                return False
            iov.consume(n)
        return True

    async def _discard(self, n: int) -> None:
        if self._scratch is None:
            self._scratch = memoryview(bytearray(SCRATCH_BYTES))
        while n:
            k = min(n, SCRATCH_BYTES)
            n -= await self._read_some(IoVec([self._scratch[:k]], k))

    async def send(self, header: Header, span: SendSpan | None = None) -> None:
        async with self._wlock:
            self._check_open()
            try:
                await self._send_locked(header, span)
            except BaseException:
                # A frame cut short (error or cancellation) leaves the stream unparseable.
                self.close()
                raise

    @staticmethod
    def _chunk(have: np.ndarray | None, block_bytes: int) -> np.ndarray:
        size = chunk_bytes(block_bytes)
        if have is None or have.nbytes < size:
            have = np.empty(size, dtype=np.uint8)
        return have

    async def _send_locked(self, header: Header, span: SendSpan | None) -> None:
        if span is None:
            head, _ = self._seal(header)
            await self._write(IoVec([memoryview(head)], len(head)))
            return
        try:
            if self.codec is not RAW:
                layout = span.blocks.layout
                wire = self.codec.encode(span.gather_all(), span.shape, layout)
                if wire is not None:  # else incompressible: this frame goes raw
                    header = {**header, "enc": self.codec.name, "wire": wire.nbytes}
                    await self._send_payload(header, [wire])
                    return
            self._tx_chunk = bounce = self._chunk(self._tx_chunk, span.blocks.layout.block_bytes)
            await self._send_payload(header, span.chunks(bounce))
        finally:
            span.release()

    async def _send_payload(self, header: Header, pieces: Iterable[np.ndarray]) -> None:
        """The header, then each piece MAC'd and written as it comes, then the tag: the
        header and tag ride in the first and last writes."""
        head, mac = self._seal(header)
        first: bytes | None = head
        for piece in pieces:
            group: list[Buffer] = [piece]
            if mac is not None:
                mac.update(piece)
            if first is not None:
                group.insert(0, memoryview(first))
                first = None
            await self._write(IoVec(group))
        tail = [] if first is None else [memoryview(first)]
        if mac is not None:
            tail.append(memoryview(mac.payload_tag()))
        if tail:
            await self._write(IoVec(tail))

    async def recv(self) -> Header:
        self._check_open()
        prefix = await self._read_exact(PREFIX.size)
        (length,) = PREFIX.unpack(prefix)
        self._codec.check_length(length)
        body = await self._read_exact(length)
        self._rx_mac = None
        if self._rx is not None:
            tag = await self._read_exact(TAG_BYTES)
            mac = self._rx.begin(prefix + body)
            if not same(tag, mac.header_tag):
                raise FrameAuthError("frame MAC does not verify (tampered, replayed or "
                                     "reordered)")
            self._rx_mac = mac
        return self._codec.decode(body)

    def _wire_bytes(self, header: Header) -> int:
        """Bytes the KV frame's payload takes on the stream (its codec's, when encoded)."""
        nbytes: int = header["nbytes"]
        if nbytes > self._max_payload:
            raise FrameTooLarge(f"payload of {nbytes} bytes over {self._max_payload}")
        enc = header.get("enc")
        if enc is None:
            if "wire" in header:
                raise MalformedFrame("KV.wire without KV.enc")
            return nbytes
        if enc != self.codec.name or self.codec is RAW:
            raise MalformedFrame(f"KV.enc {enc!r} was not negotiated (this connection: "
                                 f"{self.codec.name})")
        wire = header.get("wire")
        assert self.codec_layout is not None  # set with the codec
        most = self.codec.max_wire(header["shape"], self.codec_layout)
        if type(wire) is not int or not 0 < wire <= most:
            raise MalformedFrame(f"KV.wire {wire!r} outside 1..{most}")
        return wire

    async def recv_payload(self, header: Header, span: RecvSpan | None, alive: Alive) -> bool:
        wire = self._wire_bytes(header)
        mac, self._rx_mac = self._rx_mac, None
        if self._rx is not None and mac is None:
            raise FrameAuthError("a KV payload read without its checked header")
        trailer = 0 if mac is None else TAG_BYTES
        if span is None or not alive():
            await self._discard(wire + trailer)
            return False
        try:
            if "enc" in header:
                return await self._recv_encoded(header, wire, span, alive, mac)
            self._rx_chunk = bounce = self._chunk(self._rx_chunk, span.blocks.layout.block_bytes)
            step = bounce.nbytes
            for at in range(0, wire, step):
                n = min(step, wire - at)
                buf = span.target(at, n, bounce)
                await self._fill(IoVec([buf], n))
                if mac is not None:
                    mac.update(buf)
                if not alive():  # fenced: the rest is read into scratch and dropped
                    await self._discard(wire - at - n + trailer)
                    return False
                span.land(at, buf)  # the fence: no await since alive()
            if mac is not None and not same(await self._read_exact(TAG_BYTES),
                                            mac.payload_tag()):
                raise FrameAuthError("KV payload MAC does not verify (tampered)")
            if not alive():  # the staged path's fence: no await between it and the scatter
                return False
            span.finish()
            return True
        finally:
            span.release()

    async def _recv_encoded(self, header: Header, wire: int, span: RecvSpan, alive: Alive,
                            mac: FrameSeal | None) -> bool:
        """An encoded payload: read whole, MAC checked, then decoded and landed."""
        buf = np.empty(wire, dtype=np.uint8)
        await self._fill(IoVec([buf], wire))
        if mac is not None:
            mac.update(buf)
            if not same(await self._read_exact(TAG_BYTES), mac.payload_tag()):
                raise FrameAuthError("KV payload MAC does not verify (tampered)")
        raw = self.codec.decode(buf, span.shape, span.blocks.layout)
        if not alive():  # the fence: no await between it and the writes
            return False
        span.land(0, raw)
        span.finish()
        return True
