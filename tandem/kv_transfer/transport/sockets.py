"""A channel over a raw non-blocking socket (TCP or Unix), zero-copy both ways.

Sends use ``sendmsg`` over the block views (scatter-gather, up to ``IOV_MAX`` buffers a call);
receives use ``recvmsg_into`` straight into the destination blocks. Waiting is done with the
event loop's reader/writer callbacks, so no asyncio stream buffers sit in between.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable

from tandem.kv_transfer.blocks import Buffer
from tandem.kv_transfer.errors import ChannelClosed
from tandem.kv_transfer.frames import Header, HeaderCodec
from tandem.kv_transfer.transport.base import Alive, Channel, Handler, Listener, always
from tandem.kv_transfer.transport.byte_channel import ByteChannel, IoVec

log = logging.getLogger(__name__)

MAX_FDS = 4


def tune_socket(sock: socket.socket, buffer_bytes: int) -> None:
    """TCP_NODELAY (frames are written whole) and larger kernel buffers."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_bytes)


class SocketChannel(ByteChannel):
    """``ByteChannel`` over a socket; optionally receives file descriptors (shm handshake)."""

    def __init__(self, sock: socket.socket, codec: HeaderCodec, max_payload: int,
                 transport: str, peer: str, *, accept_fds: bool = False) -> None:
        super().__init__(codec, max_payload, transport, peer)
        sock.setblocking(False)
        self._sock = sock
        self._fd = sock.fileno()
        self._loop = asyncio.get_running_loop()
        self._waiters: set[asyncio.Future[None]] = set()
        self._accept_fds = accept_fds
        self.received_fds: list[int] = []

    async def _wait(self, writable: bool) -> None:
        fut: asyncio.Future[None] = self._loop.create_future()
        add: Callable[..., None] = self._loop.add_writer if writable else self._loop.add_reader
        remove = self._loop.remove_writer if writable else self._loop.remove_reader
        add(self._fd, _wake, fut)
        self._waiters.add(fut)
        try:
            await fut
        finally:
            self._waiters.discard(fut)
            if not self._closed:
                remove(self._fd)

    async def _write(self, iov: IoVec) -> None:
        while iov.remaining:
            self._check_open()
            try:
                n = self._sock.sendmsg(iov.head())
            except (BlockingIOError, InterruptedError):
                await self._wait(writable=True)
                continue
            except OSError as exc:
                raise ChannelClosed(f"send to {self.peer}: {exc}") from exc
            iov.consume(n)

    async def send_with_fds(self, header: Header, fds: list[int]) -> None:
        """Send the header frame ``header`` with ``fds`` attached to its first byte
        (SCM_RIGHTS)."""
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        async with self._wlock:
            data, _ = self._seal(header)
            while True:
                self._check_open()
                try:
                    n = self._sock.sendmsg([data], anc)
                    break
                except (BlockingIOError, InterruptedError):
                    await self._wait(writable=True)
                except OSError as exc:
                    raise ChannelClosed(f"send to {self.peer}: {exc}") from exc
            await self._write(IoVec([memoryview(data)[n:]]))

    def _recv(self, bufs: list[Buffer]) -> int:
        if not self._accept_fds:
            return self._sock.recvmsg_into(bufs)[0]
        n, anc, _flags, _addr = self._sock.recvmsg_into(bufs, socket.CMSG_SPACE(MAX_FDS * 4))
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                self.received_fds.extend(fds)
        return n

    async def _read_some(self, iov: IoVec, alive: Alive = always) -> int:
        while True:
            self._check_open()
            if not alive():  # the fence: after every wait, right before recvmsg_into writes
                return 0
            try:
                n = self._recv(iov.head())
            except (BlockingIOError, InterruptedError):
                await self._wait(writable=False)
                continue
            except OSError as exc:
                raise ChannelClosed(f"recv from {self.peer}: {exc}") from exc
            if n == 0:
                raise ChannelClosed(f"{self.peer} closed the connection")
            return n

    def take_fds(self) -> list[int]:
        """File descriptors received so far (the caller owns and must close them)."""
        fds, self.received_fds = self.received_fds, []
        return fds

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._loop.remove_reader(self._fd)
            self._loop.remove_writer(self._fd)
        for fut in list(self._waiters):
            if not fut.done():
                fut.set_exception(ChannelClosed(f"channel to {self.peer} closed"))
        self._sock.close()
        for fd in self.take_fds():
            with contextlib.suppress(OSError):
                os.close(fd)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


ChannelFactory = Callable[[socket.socket, str], Channel]


class SocketListener(Listener):
    """Accepts on a bound, listening socket and hands each connection to ``handler``."""

    def __init__(self, sock: socket.socket, transport: str, address: str,
                 make_channel: ChannelFactory, handler: Handler,
                 on_close: Callable[[], None] | None = None) -> None:
        self.transport = transport
        self.address = address
        self._sock = sock
        self._make = make_channel
        self._handler = handler
        self._on_close = on_close
        self._tasks: set[asyncio.Task[None]] = set()
        sock.setblocking(False)
        self._task = asyncio.get_running_loop().create_task(self._accept_loop())

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, addr = await loop.sock_accept(self._sock)
            except OSError as exc:  # EMFILE and the like: keep serving
                log.warning("%s accept failed: %s", self.transport, exc)
                await asyncio.sleep(0.05)
                continue
            peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else f"unix:{self.address}"
            try:
                channel = self._make(conn, peer)
            except Exception:  # one connection's setup failed (a socket option, memory):
                conn.close()   # drop it and keep accepting the others
                log.exception("%s: setting up the connection from %s failed", self.transport,
                              peer)
                continue
            task = loop.create_task(self._handler(channel))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._sock.close()
        if self._on_close is not None:
            self._on_close()
