"""Same-host shared memory: payloads through a segment, control frames over a Unix socket.

    sender                               receiver
    take a free slot  <---- CREDIT ----  (slot copied out)
    gather blocks -> slot (hash each piece while hot)
    KV {slot, xxh} -------------------->  copy slot -> reserved blocks, piece by piece, hashing
                                          each piece right after copying it; CREDIT

The receiver creates one anonymous ``memfd`` segment (``slots * slot_bytes``) per accepted
connection after authentication and passes the fd with the handshake ACK (``SCM_RIGHTS``). The
segment has no name, so nothing leaks when either process dies. A payload is copied once per
side: the sender gathers the blocks straight into the slot, the receiver scatters straight out
of it into the reserved blocks (one numpy call per ~512 KiB piece of whole rows; zero-copy is
impossible here, since the sender must not write the receiver's cache). Each side hashes a
piece right after copying it, while it is in cache, so the hash costs no memory pass of its
own. The receiver hashes a piece after copying it out, so a sender rewriting a slot before
the receiver is done with it is caught as corruption.

The hash is an integrity check of one peer's slot discipline, not authentication: the sealed
header carries it, and an authenticated sender can write any bytes into its reserved blocks
anyway. A receiver may turn it off (``checksum=False``, ``ReceiverConfig.shm_checksum``); it
says so in the handshake ACK (``shm_xxh``) and its senders then compute none.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import mmap
import os
import secrets
import socket
import tempfile
from typing import Any

import numpy as np
import xxhash

from tandem.kv_transfer.blocks import KvBlocks, RecvSpan, SendSpan, chunk_bytes
from tandem.kv_transfer.config import Limits
from tandem.kv_transfer.endpoint import Endpoint
from tandem.kv_transfer.errors import (
    ChannelClosed,
    FrameTooLarge,
    MalformedFrame,
    PayloadChecksumError,
    ProtocolError,
    TransferSpecError,
)
from tandem.kv_transfer.frames import Header, HeaderCodec, Kind
from tandem.kv_transfer.transport.base import Alive, Channel, Handler, Listener, Transport
from tandem.kv_transfer.transport.sockets import SocketChannel, SocketListener

log = logging.getLogger(__name__)


class ShmChannel(SocketChannel):
    """A Unix-socket channel whose KV payloads go through a shared segment's slots."""

    takes_codecs = False

    def __init__(self, sock: socket.socket, codec: HeaderCodec, *, server: bool, slots: int,
                 slot_bytes: int, max_payload: int, peer: str, checksum: bool = True) -> None:
        super().__init__(sock, codec, min(max_payload, slot_bytes), "shm", peer,
                         accept_fds=not server)
        self._server = server
        self._slots = slots
        self._slot_bytes = slot_bytes
        self.checksum = checksum  # the receiver's choice; a sender learns it from the ACK
        self._mm: mmap.mmap | None = None
        self._seg: memoryview | None = None
        self._fd_to_send: int | None = None
        self._free: collections.deque[int] = collections.deque()
        self._in_use: set[int] = set()
        self._slot_waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    # -- setup --------------------------------------------------------------------------------

    def server_setup(self, hello: Header) -> dict[str, Any]:
        size = self._slots * self._slot_bytes
        fd = os.memfd_create("tandem-kv", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            self._map(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self._fd_to_send = fd
        return {"shm_slots": self._slots, "shm_slot_bytes": self._slot_bytes,
                "shm_xxh": self.checksum}

    def client_setup(self, ack: Header) -> None:
        fds = self.take_fds()
        try:
            slots, slot_bytes = ack.get("shm_slots"), ack.get("shm_slot_bytes")
            checksum = ack.get("shm_xxh", True)
            if type(slots) is not int or type(slot_bytes) is not int or len(fds) != 1 \
                    or not 0 < slots <= 1024 or not 0 < slot_bytes <= 1 << 30 \
                    or type(checksum) is not bool:
                raise MalformedFrame("shm handshake ACK lacks a segment")
            size = slots * slot_bytes
            if os.fstat(fds[0]).st_size != size:
                raise MalformedFrame("shm segment size does not match the ACK")
            self._slots, self._slot_bytes = slots, slot_bytes
            self._max_payload = slot_bytes
            self.checksum = checksum
            self._map(fds[0], size)
        finally:
            for fd in fds:
                os.close(fd)
        self._free.extend(range(slots))

    def _map(self, fd: int, size: int) -> None:
        self._mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._seg = memoryview(self._mm)

    @property
    def buffered_bytes(self) -> int:
        segment = 0 if self._mm is None else self._slots * self._slot_bytes
        return segment + super().buffered_bytes

    # -- frames -------------------------------------------------------------------------------

    async def send(self, header: Header, span: SendSpan | None = None) -> None:
        if self._fd_to_send is not None and span is None:  # the handshake ACK carries the fd
            fd, self._fd_to_send = self._fd_to_send, None
            try:
                await self.send_with_fds(header, [fd])
            finally:
                os.close(fd)
            return
        if span is None:
            await super().send(header)
            return
        if self._seg is None:
            raise ChannelClosed("shm channel has no segment")
        if span.nbytes > self._slot_bytes:
            raise TransferSpecError(f"frame of {span.nbytes} bytes over the shm slot size")
        slot = await self._take_slot()
        try:
            out = self._slot_array(slot, span.nbytes)
            hasher = xxhash.xxh3_64() if self.checksum else None
            try:
                for piece in span.fill(out, self._piece_bytes(span.blocks)):
                    if hasher is not None:
                        hasher.update(piece)  # while the piece is in cache
            finally:
                span.release()
            del out  # drop the export of the mapping before anything can close it
            extra = {"slot": slot} if hasher is None else {"slot": slot,
                                                           "xxh": hasher.intdigest()}
            await super().send({**header, **extra})
        except BaseException:
            self._give_back(slot)
            raise

    async def _take_slot(self) -> int:
        while not self._free:
            self._check_open()
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._slot_waiters.append(fut)
            try:
                await fut
            finally:
                if fut in self._slot_waiters:
                    self._slot_waiters.remove(fut)
        self._check_open()
        slot = self._free.popleft()
        self._in_use.add(slot)
        return slot

    def _give_back(self, slot: int) -> None:
        if slot in self._in_use:
            self._in_use.discard(slot)
            self._free.append(slot)
            while self._slot_waiters:
                fut = self._slot_waiters.popleft()
                if not fut.done():
                    fut.set_result(None)
                    break

    @property
    def slots_in_use(self) -> int:
        """Slots holding a frame the receiver has not credited back yet (sender side)."""
        return len(self._in_use)

    async def recv(self) -> Header:
        while True:
            header = await super().recv()
            if header["kind"] != Kind.CREDIT:
                return header
            slot = header["slot"]
            if self._server or slot not in self._in_use:
                raise ProtocolError(f"unexpected CREDIT for slot {slot}")
            self._give_back(slot)

    async def recv_payload(self, header: Header, span: RecvSpan | None, alive: Alive) -> bool:
        slot, digest, nbytes = header.get("slot"), header.get("xxh"), header["nbytes"]
        if slot is None or (digest is None and self.checksum) or not 0 <= slot < self._slots \
                or self._seg is None:
            raise MalformedFrame("shm KV frame lacks a valid slot and hash")
        if nbytes > self._slot_bytes:
            raise FrameTooLarge(f"shm payload of {nbytes} bytes over the slot size")
        landed = False
        # The fence: the payload is in the slot before its header arrives, and the check and
        # the scatter into the blocks run with no await in between.
        if span is not None and alive():
            try:
                got = self._land(slot, nbytes, span)
                landed = got is None or got == digest
                if landed:
                    span.finish()
            finally:
                span.release()
            if not landed:
                await self.send({"kind": Kind.CREDIT, "slot": slot})
                raise PayloadChecksumError("payload hash does not match the frame's xxh")
        await self.send({"kind": Kind.CREDIT, "slot": slot})
        return landed

    def _slot_array(self, slot: int, nbytes: int) -> np.ndarray:
        assert self._mm is not None
        return np.frombuffer(self._mm, dtype=np.uint8, count=nbytes,
                             offset=slot * self._slot_bytes)

    @staticmethod
    def _piece_bytes(blocks: KvBlocks) -> int:
        """Bytes of one copy-and-hash piece: whole rows, small enough to stay in cache."""
        return chunk_bytes(blocks.layout.block_bytes)

    def _land(self, slot: int, nbytes: int, span: RecvSpan) -> int | None:
        """Copy a slot into the span's blocks piece by piece; the slot's hash (None when this
        link has no checksum).

        Each piece is hashed right after it is copied out: a sender that rewrites a piece
        before or during its copy changes what the hash sees, one that rewrites it later
        changes nothing the receiver keeps; and the piece is still in cache for the hash.
        """
        data = self._slot_array(slot, nbytes)
        hasher = xxhash.xxh3_64() if self.checksum else None
        step = self._piece_bytes(span.blocks)
        for at in range(0, nbytes, step):
            piece = data[at:at + step]
            span.land(at, piece)
            if hasher is not None:
                hasher.update(piece)
        return None if hasher is None else hasher.intdigest()

    def close(self) -> None:
        if self._closed:
            return
        super().close()
        while self._slot_waiters:
            fut = self._slot_waiters.popleft()
            if not fut.done():
                fut.set_exception(ChannelClosed("shm channel closed"))
        if self._fd_to_send is not None:
            os.close(self._fd_to_send)
            self._fd_to_send = None
        if self._seg is not None:
            self._seg.release()
            self._seg = None
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # a slice is still alive somewhere; the GC unmaps it
                log.debug("shm segment still exported at close")
            self._mm = None


class ShmTransport(Transport):
    """Shared memory between processes on one host (see the module docstring)."""

    name = "shm"

    def __init__(self, limits: Limits, *, slots: int = 4, slot_bytes: int = 8 << 20,
                 socket_dir: str | None = None, checksum: bool = True) -> None:
        """``slots``, ``slot_bytes``, ``checksum``: the segment a listener offers each
        connection and whether its slots are hashed (a connecting sender follows the
        receiver's ACK)."""
        self._codec = HeaderCodec(limits)
        self._checksum = checksum
        self._max_payload = limits.max_payload_bytes
        self._slots, self._slot_bytes = slots, slot_bytes
        self._dir = socket_dir or tempfile.gettempdir()

    async def listen(self, handler: Handler, blocks: KvBlocks) -> Listener:
        path = os.path.join(self._dir, f"tandem-kv-{os.getpid()}-{secrets.token_hex(6)}.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            os.chmod(path, 0o600)
            sock.listen(256)
        except BaseException:
            sock.close()
            raise

        def make(conn: socket.socket, peer: str) -> Channel:
            return ShmChannel(conn, self._codec, server=True, slots=self._slots,
                              slot_bytes=self._slot_bytes, max_payload=self._max_payload,
                              peer=peer, checksum=self._checksum)

        def unlink() -> None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

        return SocketListener(sock, "shm", path, make, handler, on_close=unlink)

    def reaches(self, endpoint: Endpoint, blocks: KvBlocks) -> bool:
        return endpoint.address("shm") is not None and endpoint.same_host

    async def connect(self, address: str, blocks: KvBlocks, timeout: float) -> Channel:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await asyncio.wait_for(loop.sock_connect(sock, address), timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            sock.close()
            raise ChannelClosed(f"shm connect to {address}: {exc!r}") from exc
        return ShmChannel(sock, self._codec, server=False, slots=0, slot_bytes=1,
                          max_payload=self._max_payload, peer=f"unix:{address}")
