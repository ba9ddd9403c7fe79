"""An in-process transport for tests: byte pipes with fault hooks.

It runs the real framing code (``ByteChannel``) over bounded in-memory pipes, so everything but
the socket is exercised. ``FakeNetwork`` is the only shared state; pass it to both sides.
Each connection is a ``FakeLink`` the test can break: ``reset()``, ``flip(offset)`` (corrupt one
byte the sender has yet to write), or close one end.
"""

from __future__ import annotations

import asyncio
import itertools

from tandem.kv_transfer.blocks import Buffer, KvBlocks
from tandem.kv_transfer.config import Limits
from tandem.kv_transfer.endpoint import Endpoint
from tandem.kv_transfer.errors import ChannelClosed
from tandem.kv_transfer.frames import HeaderCodec
from tandem.kv_transfer.transport.base import Alive, Channel, Handler, Listener, Transport, always
from tandem.kv_transfer.transport.byte_channel import ByteChannel, IoVec


class _Pipe:
    """One direction of a link: a bounded byte buffer with EOF, reset and byte flips."""

    def __init__(self, capacity: int) -> None:
        self.buf = bytearray()
        self.capacity = capacity
        self.eof = False
        self.reset = False
        self.written = 0
        self.flips: set[int] = set()
        self.stalled = False
        self._changed = asyncio.Event()

    def _poke(self) -> None:
        self._changed.set()

    async def _wait(self) -> None:
        self._changed.clear()
        await self._changed.wait()

    async def write(self, data: Buffer) -> None:
        pos = 0
        while pos < data.nbytes:
            if self.reset or self.eof:
                raise ChannelClosed("fake link: write after reset or close")
            space = self.capacity - len(self.buf)
            if space <= 0:
                await self._wait()
                continue
            chunk = bytearray(data[pos:pos + space])
            for at in [f for f in self.flips if self.written <= f < self.written + len(chunk)]:
                chunk[at - self.written] ^= 0xFF
                self.flips.discard(at)
            self.buf += chunk
            self.written += len(chunk)
            pos += len(chunk)
            self._poke()

    async def read_into(self, iov: IoVec, alive: Alive = always) -> int:
        while not self.buf or self.stalled:
            if self.reset:
                raise ChannelClosed("fake link: connection reset")
            if self.eof and not self.buf:
                raise ChannelClosed("fake link: peer closed")
            await self._wait()
        if self.reset:
            raise ChannelClosed("fake link: connection reset")
        if not alive():  # the fence, as on a socket: the bytes are here, none written
            return 0
        k = min(len(self.buf), iov.remaining)
        n = iov.fill_from(bytes(self.buf[:k]))
        del self.buf[:n]
        self._poke()
        return n


class FakeLink:
    """Both directions of one fake connection, with the faults a test can inject."""

    def __init__(self, capacity: int) -> None:
        self.to_receiver = _Pipe(capacity)
        self.to_sender = _Pipe(capacity)

    def reset(self) -> None:
        """Both ends see ``ChannelClosed`` on their next read or write (like a TCP RST)."""
        for pipe in (self.to_receiver, self.to_sender):
            pipe.reset = True
            pipe._poke()

    def stall(self) -> None:
        """The receiver stops seeing bytes (they queue up, the pipe fills, writers block)."""
        self.to_receiver.stalled = True

    def resume(self) -> None:
        """Undo ``stall``."""
        self.to_receiver.stalled = False
        self.to_receiver._poke()

    def flip(self, offset: int) -> None:
        """Invert the byte the sender will write ``offset`` bytes from now."""
        self.to_receiver.flips.add(self.to_receiver.written + offset)

    @property
    def buffered_bytes(self) -> int:
        """Bytes sitting in the pipes."""
        return len(self.to_receiver.buf) + len(self.to_sender.buf)


class FakeChannel(ByteChannel):
    """A ``ByteChannel`` over a pair of ``_Pipe``s."""

    def __init__(self, inbound: _Pipe, outbound: _Pipe, codec: HeaderCodec, max_payload: int,
                 peer: str) -> None:
        super().__init__(codec, max_payload, "fake", peer)
        self._in, self._out = inbound, outbound

    async def _write(self, iov: IoVec) -> None:
        self._check_open()
        for b in iov.head(len(iov.bufs)):
            await self._out.write(b)
        iov.consume(iov.remaining)

    async def _read_some(self, iov: IoVec, alive: Alive = always) -> int:
        self._check_open()
        return await self._in.read_into(iov, alive)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._out.eof = True
        self._out._poke()
        self._in.reset = True
        self._in._poke()


class FakeNetwork:
    """The registry that fake listeners and connections share (pass it explicitly)."""

    def __init__(self, pipe_bytes: int = 1 << 20) -> None:
        self.pipe_bytes = pipe_bytes
        self.links: list[FakeLink] = []
        self._listeners: dict[str, tuple[Handler, FakeTransport]] = {}
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()

    def register(self, handler: Handler, transport: FakeTransport) -> str:
        address = f"fake-{next(self._ids)}"
        self._listeners[address] = (handler, transport)
        return address

    def unregister(self, address: str) -> None:
        self._listeners.pop(address, None)

    def knows(self, address: str) -> bool:
        return address in self._listeners

    def dial(self, address: str, client: FakeTransport) -> FakeChannel:
        """Connect to ``address``: the server end goes to its handler, the client end back."""
        entry = self._listeners.get(address)
        if entry is None:
            raise ChannelClosed(f"fake connect to {address}: connection refused")
        handler, server = entry
        link = FakeLink(self.pipe_bytes)
        self.links.append(link)
        server_end = FakeChannel(link.to_receiver, link.to_sender, server.codec,
                                 server.max_payload, f"{address}-client")
        client_end = FakeChannel(link.to_sender, link.to_receiver, client.codec,
                                 client.max_payload, address)
        task = asyncio.get_running_loop().create_task(handler(server_end))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return client_end


class _FakeListener(Listener):
    def __init__(self, network: FakeNetwork, address: str) -> None:
        self.transport = "fake"
        self.address = address
        self._network = network

    async def close(self) -> None:
        self._network.unregister(self.address)


class FakeTransport(Transport):
    """The in-process transport (see the module docstring)."""

    name = "fake"

    def __init__(self, network: FakeNetwork, limits: Limits | None = None) -> None:
        self.network = network
        limits = limits or Limits()
        self.codec = HeaderCodec(limits)
        self.max_payload = limits.max_payload_bytes

    async def listen(self, handler: Handler, blocks: KvBlocks) -> Listener:
        return _FakeListener(self.network, self.network.register(handler, self))

    def reaches(self, endpoint: Endpoint, blocks: KvBlocks) -> bool:
        address = endpoint.address("fake")
        return address is not None and self.network.knows(address)

    async def connect(self, address: str, blocks: KvBlocks, timeout: float) -> Channel:
        return self.network.dial(address, self)
