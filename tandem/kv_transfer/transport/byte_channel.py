"""Framing over a byte stream, shared by the TCP, TLS, Unix-socket and fake channels.

    handshake frames:                | u32 H | header (H bytes) | payload (nbytes) | u64 xxh3_64 |
    after ``start_macs`` (frame_mac.py): | u32 H | header | tag_h | payload (nbytes) | tag_p |
        tag_h is checked before the header is parsed; tag_p before the payload counts as
        landed (a payload that is discarded, its reservation gone, is never used, so its
        bytes are not checked; the authenticated header says how many to skip)

Subclasses supply two primitives: ``_write`` (drain an ``IoVec``) and ``_read_some`` (fill at
least one byte of an ``IoVec``'s head). Payloads move in batches of ``BATCH_BYTES``: each batch
is hashed right before it is written or right after it is read, while it is still in cache.

The fence: ``_read_some`` takes the reservation's ``alive`` and checks it once the bytes are
there (after any wait for them) and immediately before writing them into the buffers, which
on a CPU cache are the reserved blocks themselves. A payload whose reservation ends mid-way is
read on into scratch and dropped, so the stream stays in sync.
"""

from __future__ import annotations

import abc
import asyncio
from typing import Any

import xxhash

from tandem.kv_transfer.blocks import Buffer, RecvSpan, SendSpan
from tandem.kv_transfer.errors import (
    ChannelClosed,
    FrameAuthError,
    FrameTooLarge,
    PayloadChecksumError,
)
from tandem.kv_transfer.frame_mac import TAG_BYTES, FrameMac, FrameSeal, SessionKeys, same
from tandem.kv_transfer.frames import PREFIX, TRAILER, Header, HeaderCodec, encode_header
from tandem.kv_transfer.transport.base import Alive, Channel, always

IOV_MAX = 1024  # Linux UIO_MAXIOV: buffers per sendmsg / recvmsg_into call
BATCH_BYTES = 256 << 10
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


def batches(views: list[Buffer], limit: int = BATCH_BYTES) -> list[tuple[list[Buffer], int]]:
    """Group views into ``(views, nbytes)`` batches of about ``limit`` bytes; a view larger than
    ``limit`` is cut into ``limit``-sized pieces."""
    out: list[tuple[list[Buffer], int]] = []
    cur: list[Buffer] = []
    size = 0
    for v in views:
        nb = v.nbytes
        if nb > limit:
            if cur:
                out.append((cur, size))
                cur, size = [], 0
            out += [([v[a:a + limit]], min(limit, nb - a)) for a in range(0, nb, limit)]
            continue
        cur.append(v)
        size += nb
        if size >= limit:
            out.append((cur, size))
            cur, size = [], 0
    if cur:
        out.append((cur, size))
    return out


class ByteChannel(Channel):
    """A ``Channel`` whose payloads travel on the stream after their header."""

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

    async def _fill(self, iov: IoVec, alive: Alive) -> bool:
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

    async def _send_locked(self, header: Header, span: SendSpan | None) -> None:
        head, mac = self._seal(header)
        if span is None:
            await self._write(IoVec([memoryview(head)], len(head)))
            return
        try:
            hasher: Any = xxhash.xxh3_64() if mac is None else mac
            update = hasher.update
            groups = batches(span.views())
            last = len(groups) - 1
            for i, (group, size) in enumerate(groups):
                for v in group:
                    update(v)
                if i == 0:
                    group = [memoryview(head), *group]
                    size += len(head)
                if i == last:
                    trailer = (TRAILER.pack(hasher.intdigest()) if mac is None
                               else mac.payload_tag())
                    group = [*group, memoryview(trailer)]
                    size += len(trailer)
                await self._write(IoVec(group, size))
        finally:
            span.release()

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

    async def recv_payload(self, header: Header, span: RecvSpan | None, alive: Alive) -> bool:
        nbytes: int = header["nbytes"]
        if nbytes > self._max_payload:
            raise FrameTooLarge(f"payload of {nbytes} bytes over {self._max_payload}")
        mac, self._rx_mac = self._rx_mac, None
        if self._rx is not None and mac is None:
            raise FrameAuthError("a KV payload read without its checked header")
        trailer = TRAILER.size if self._rx is None else TAG_BYTES
        if span is None or not alive():
            await self._discard(nbytes + trailer)
            return False
        try:
            hasher: Any = xxhash.xxh3_64() if mac is None else mac
            update = hasher.update
            groups = batches(span.views())
            for i, (group, size) in enumerate(groups):
                if not await self._fill(IoVec(list(group), size), alive):
                    rest = sum(s for _, s in groups[i + 1:])
                    await self._discard(rest + trailer)
                    return False
                for v in group:
                    update(v)
            if mac is not None:
                if not same(await self._read_exact(TAG_BYTES), mac.payload_tag()):
                    raise FrameAuthError("KV payload MAC does not verify (tampered)")
            else:
                (digest,) = TRAILER.unpack(await self._read_exact(TRAILER.size))
                if digest != hasher.intdigest():
                    raise PayloadChecksumError("payload hash does not match its trailer")
            if not alive():  # the staged path's fence: no await between it and the scatter
                return False
            span.finish()
            return True
        finally:
            span.release()
