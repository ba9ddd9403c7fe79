"""Helpers for tests of kv_transfer and of the workers that use it (unit, chaos, integration).

Small layouts and caches, a bit-exact block comparison, a teardown that asserts nothing is left
held, a hand-driven protocol peer (``RawPeer``, for hostile-input tests), a hand-driven sender
over any transport that can hold a frame half-sent (``HandSender``, for the write fence) and a
receiver running on its own thread (``ReceiverThread``, for synchronous and hypothesis-driven
tests).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
import xxhash

from tandem.kv_transfer.blocks import TORCH_DTYPES, KvBlocks
from tandem.kv_transfer.config import Limits, ReceiverConfig, SenderConfig, TlsConfig
from tandem.kv_transfer.endpoint import Endpoint, split_host_port
from tandem.kv_transfer.errors import ChannelClosed
from tandem.kv_transfer.frame_mac import TAG_BYTES, FrameMac, FrameSeal, session_keys
from tandem.kv_transfer.frames import PREFIX, PROTOCOL_VERSION, Header, HeaderCodec, Kind
from tandem.kv_transfer.frames import encode_header as encode_header
from tandem.kv_transfer.handshake import RECEIVER_LABEL, SENDER_LABEL, client_handshake, proof
from tandem.kv_transfer.layout import KvLayout
from tandem.kv_transfer.receiver import Receiver
from tandem.kv_transfer.sender import Sender
from tandem.kv_transfer.transport.base import Channel, Transport
from tandem.kv_transfer.transport.byte_channel import ByteChannel, IoVec
from tandem.kv_transfer.transport.fake import FakeNetwork, FakeTransport
from tandem.kv_transfer.transport.shm import ShmChannel, ShmTransport
from tandem.kv_transfer.transport.tcp import TcpTransport

T = TypeVar("T")
TEST_SECRET = b"tandem-kv-test-secret-0123456789"


def tiny_layout(kv_dtype: str = "float16", *, layers: int = 3, heads: int = 2, head_dim: int = 8,
                block_size: int = 4, model_id: str = "tiny-test") -> KvLayout:
    """A small layout: blocks of ``block_size * heads * head_dim`` elements."""
    return KvLayout(model_id, kv_dtype, kv_dtype, block_size, layers, heads, head_dim)


def cache_shape(layout: KvLayout, num_blocks: int) -> tuple[int, ...]:
    """``[layers, planes, num_blocks, block_size, kv_heads, row_width]``."""
    return (layout.num_layers, layout.planes, num_blocks, layout.block_size, layout.num_kv_heads,
            layout.row_width)


def random_cache(layout: KvLayout, num_blocks: int, seed: int = 0) -> torch.Tensor:
    """A cache full of random bit patterns (NaNs and infinities included: bit-exact tests)."""
    kv = torch.empty(cache_shape(layout, num_blocks), dtype=TORCH_DTYPES[layout.kv_dtype])
    raw = kv.view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8,
                            generator=torch.Generator().manual_seed(seed)))
    return kv


def zero_cache(layout: KvLayout, num_blocks: int) -> torch.Tensor:
    """An all-zero cache."""
    return torch.zeros(cache_shape(layout, num_blocks), dtype=TORCH_DTYPES[layout.kv_dtype])


def blocks_equal(a: torch.Tensor, a_ids: Sequence[int], b: torch.Tensor,
                 b_ids: Sequence[int]) -> bool:
    """True when ``a[:, :, a_ids]`` and ``b[:, :, b_ids]`` are bit-identical."""
    left = a[:, :, list(a_ids)].contiguous().view(torch.uint8)
    right = b[:, :, list(b_ids)].contiguous().view(torch.uint8)
    return bool(torch.equal(left, right))


def blocks_digest(kv: torch.Tensor, ids: Sequence[int]) -> int:
    """xxh3_64 of ``kv[:, :, ids]`` (to compare across processes)."""
    data = kv[:, :, list(ids)].contiguous().view(torch.uint8).cpu().numpy().tobytes()
    return xxhash.xxh3_64_intdigest(data)


def run(coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
    """Run an async test body on a fresh loop, failing (not hanging) after ``timeout``."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def settle_and_check(rx: Receiver, *senders: Sender, timeout: float = 10.0) -> None:
    """Close the senders, wait for the receiver to drop their connections, then assert both
    sides hold nothing: no reservation, transfer, connection or buffer."""
    for tx in senders:
        await tx.close()
        st = tx.stats()
        assert (st.transfers, st.connections, st.buffered_bytes) == (0, 0, 0), st
    stats = await rx.wait_until(lambda s: s.connections == 0, timeout)
    assert stats.reservations == 0, stats
    assert stats.bound_transfers == 0, stats
    assert stats.held_blocks == 0, stats
    assert stats.buffered_bytes == 0, stats


@dataclass(slots=True)
class Pair:
    """A started receiver and a sender that reaches it over one transport."""

    rx: Receiver
    tx: Sender
    src: torch.Tensor
    dst: torch.Tensor
    endpoint: Endpoint
    network: FakeNetwork | None = None


PAIR_KINDS = ("fake", "staged", "tcp", "tls", "shm", "shm_staged")


async def make_pair(kind: str, layout: KvLayout, *, src_blocks: int = 16, dst_blocks: int = 16,
                    rx_config: ReceiverConfig | None = None,
                    tx_config: SenderConfig | None = None, tls: TlsConfig | None = None,
                    seed: int = 0) -> Pair:
    """Receiver + sender over ``kind``: "fake", "staged" (fake, through host staging buffers, the
    path CUDA caches take), "tcp", "tls" (needs ``tls``), "shm" or "shm_staged". The source
    cache is random, the destination zero."""
    src, dst = random_cache(layout, src_blocks, seed), zero_cache(layout, dst_blocks)
    rx_cfg = rx_config or ReceiverConfig(TEST_SECRET)
    tx_cfg = tx_config or SenderConfig(TEST_SECRET)
    limits_rx, limits_tx = rx_cfg.limits, tx_cfg.limits
    network = None
    staged = None
    rx_t: list[Transport]
    tx_t: list[Transport]
    if kind in ("fake", "staged"):
        network = FakeNetwork()
        rx_t, tx_t = [FakeTransport(network, limits_rx)], [FakeTransport(network, limits_tx)]
        staged = kind == "staged" or None
    elif kind in ("tcp", "tls"):
        if kind == "tls" and tls is None:
            raise ValueError("kind 'tls' needs a TlsConfig")
        rx_t = [TcpTransport(limits_rx, tls=tls if kind == "tls" else None)]
        tx_t = [TcpTransport(limits_tx, tls=tls if kind == "tls" else None)]
    elif kind in ("shm", "shm_staged"):
        staged = kind == "shm_staged" or None
        rx_t = [ShmTransport(limits_rx, slots=rx_cfg.shm_slots, slot_bytes=rx_cfg.shm_slot_bytes,
                             socket_dir=rx_cfg.socket_dir, checksum=rx_cfg.shm_checksum)]
        tx_t = [ShmTransport(limits_tx)]
    else:
        raise ValueError(f"unknown pair kind {kind!r}")
    rx = Receiver(dst, layout, rx_cfg, rx_t, staged=staged)
    endpoint = await rx.start()
    tx = Sender(src, layout, tx_cfg, tx_t, staged=staged)
    return Pair(rx, tx, src, dst, endpoint, network)


async def finish(pair: Pair) -> None:
    """``settle_and_check`` the pair, then close the receiver."""
    await settle_and_check(pair.rx, pair.tx)
    await pair.rx.close()


def deadline(seconds: float = 20.0) -> float:
    """A ``time.monotonic()`` deadline ``seconds`` from now."""
    return time.monotonic() + seconds


# -- a hand-driven peer ---------------------------------------------------------------------------


class RawPeer:
    """A TCP client that speaks (or breaks) the protocol by hand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.codec = HeaderCodec(Limits())
        self.tx: FrameMac | None = None  # after ``handshake``: frames are sealed both ways
        self.rx: FrameMac | None = None

    @classmethod
    async def connect(cls, endpoint: Endpoint) -> RawPeer:
        address = endpoint.address("tcp")
        assert address is not None, "receiver has no tcp address"
        host, port = split_host_port(address)
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def send_raw(self, data: bytes) -> None:
        """Write bytes as they are (ignoring a peer that already closed)."""
        try:
            self.writer.write(data)
            await self.writer.drain()
        except (ConnectionError, OSError):
            pass

    def seal(self, header: Header) -> tuple[bytes, FrameSeal | None]:
        """A header's bytes as they go on the wire now (with its tag after the handshake)
        and the frame's running MAC (None before)."""
        head = encode_header(header)
        if self.tx is None:
            return head, None
        mac = self.tx.begin(head)
        return head + mac.header_tag, mac

    def frame_bytes(self, header: Header, payload: bytes = b"",
                    trailer: bytes | None = None) -> bytes:
        """A whole frame as an honest peer writes it; with a payload, its tag (after the
        handshake; nothing before it) or ``trailer`` if given."""
        data, mac = self.seal(header)
        if payload or "nbytes" in header:
            if trailer is None and mac is None:
                trailer = b""
            elif trailer is None:
                mac.update(payload)
                trailer = mac.payload_tag()
            data += payload + trailer
        return data

    async def send_frame(self, header: Header, payload: bytes = b"",
                         trailer: bytes | None = None) -> None:
        """Send ``frame_bytes(header, payload, trailer)``."""
        await self.send_raw(self.frame_bytes(header, payload, trailer))

    def half_close(self) -> None:
        """Signal EOF to the receiver (ignoring a peer that already closed)."""
        try:
            self.writer.write_eof()
        except OSError:
            pass

    async def recv_frame(self, timeout: float = 5.0) -> Header:
        """The next header from the receiver (raises ``ChannelClosed`` at EOF); after the
        handshake its tag is checked (AssertionError when it does not verify)."""
        try:
            prefix = await asyncio.wait_for(self.reader.readexactly(PREFIX.size), timeout)
            (n,) = PREFIX.unpack(prefix)
            body = await asyncio.wait_for(self.reader.readexactly(n), timeout)
            if self.rx is not None:
                tag = await asyncio.wait_for(self.reader.readexactly(TAG_BYTES), timeout)
                assert tag == self.rx.begin(prefix + body).header_tag, "bad tag from receiver"
            return self.codec.decode(body)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise ChannelClosed("receiver closed the connection") from exc

    async def hello(self, nonce_s: bytes = b"n" * 16) -> Header:
        """The first HELLO; returns the receiver's answer."""
        await self.send_frame({"kind": Kind.HELLO, "version": PROTOCOL_VERSION,
                               "nonce": nonce_s, "transport": "tcp"})
        return await self.recv_frame()

    async def handshake(self, layout: KvLayout, secret: bytes = TEST_SECRET,
                        codec: str | None = None) -> Header:
        """Complete HELLO as an honest sender would (frames are sealed from then on), asking
        for payload ``codec`` if given; returns the receiver's ACK."""
        nonce_s = b"n" * 16
        hello = await self.hello(nonce_s)
        assert hello["kind"] == Kind.HELLO, hello
        nonce_r = hello["nonce"]
        assert hello["proof"] == proof(secret, RECEIVER_LABEL, nonce_s, nonce_r)
        fp = layout.fingerprint
        ask = {} if codec is None else {"codec": codec}
        await self.send_frame({"kind": Kind.HELLO, "layout": layout.to_wire(), "fingerprint": fp,
                               "proof": proof(secret, SENDER_LABEL, nonce_r, nonce_s, fp),
                               **ask})
        keys = session_keys(secret, nonce_s, nonce_r, fp, sender=True)
        self.tx, self.rx = FrameMac(keys.send), FrameMac(keys.recv)
        done = await self.recv_frame()
        assert done["kind"] == Kind.ACK and done["fingerprint"] == fp, done
        return done

    async def closed_by_peer(self, timeout: float = 5.0) -> bool:
        """Read (and drop) until the receiver closes; True when it did within ``timeout``."""
        async def drain() -> None:
            while await self.reader.read(65536):
                pass

        try:
            await asyncio.wait_for(drain(), timeout)
        except (ConnectionError, OSError):
            return True
        except asyncio.TimeoutError:
            return False
        return True

    def close(self) -> None:
        """Drop the connection."""
        self.writer.close()


# -- a hand-driven sender over any transport -------------------------------------------------------


def kv_frame(layout: KvLayout, transfer: str, blocks: list[int], lo: int, hi: int) -> Header:
    """The header of a KV frame for layers ``[lo, hi)`` of ``blocks``."""
    return {"kind": Kind.KV, "transfer": transfer, "layers": [lo, hi], "blocks": blocks,
            "dtype": layout.kv_dtype, "shape": layout.payload_shape(hi - lo, len(blocks)),
            "nbytes": layout.payload_bytes(hi - lo, len(blocks))}


class HandSender:
    """An authenticated sender driven frame by frame over a real channel of any transport (tcp,
    tls, fake, shm). ``hold_kv`` sends the first part of a KV frame and returns a coroutine
    function that sends the rest: a frame whose bytes are still arriving, for as long as the
    test likes. On byte streams the first part is the header (the payload is held back); on
    shm the payload goes into a slot and half the header is sent."""

    def __init__(self, channel: Channel, layout: KvLayout) -> None:
        self.ch = channel
        self.layout = layout

    @classmethod
    async def connect(cls, transport: Transport, endpoint: Endpoint, layout: KvLayout,
                      secret: bytes = TEST_SECRET) -> HandSender:
        """Dial ``endpoint`` over ``transport`` and complete HELLO."""
        address = endpoint.address(transport.name)
        assert address is not None, f"receiver has no {transport.name} address"
        ch = await transport.connect(address, KvBlocks(zero_cache(layout, 1), layout), 5.0)
        try:
            await client_handshake(ch, layout, secret)
        except BaseException:
            ch.close()
            raise
        return cls(ch, layout)

    async def send(self, header: Header) -> None:
        """A frame without payload (BEGIN, KEEPALIVE, COMMIT, ABORT)."""
        await self.ch.send(header)

    async def recv(self, timeout: float = 5.0) -> Header:
        """The receiver's next frame (shm CREDITs are taken in passing)."""
        return await asyncio.wait_for(self.ch.recv(), timeout)

    async def hold_kv(self, transfer: str, blocks: list[int], lo: int, hi: int,
                      payload: bytes, rewrite: bytes | None = None
                      ) -> Callable[[], Awaitable[None]]:
        """Send the first part of a KV frame now; await the returned function for the rest.
        ``rewrite`` (shm): bytes written over the slot after it was hashed, as a sender that
        reuses a slot before its CREDIT would."""
        header = kv_frame(self.layout, transfer, blocks, lo, hi)
        assert len(payload) == header["nbytes"], "payload size does not match the frame"
        digest = xxhash.xxh3_64_intdigest(payload)
        ch = self.ch
        assert isinstance(ch, ByteChannel)
        if isinstance(ch, ShmChannel):
            slot = await ch._take_slot()
            ch._slot_array(slot, len(payload))[:] = np.frombuffer(payload, dtype=np.uint8)
            head, _ = ch._seal({**header, "slot": slot, "xxh": digest})
            if rewrite is not None:
                ch._slot_array(slot, len(rewrite))[:] = np.frombuffer(rewrite, dtype=np.uint8)
            first, rest = head[: len(head) // 2], head[len(head) // 2:]
        else:
            first, mac = ch._seal(header)
            if mac is None:  # TLS: authenticated by TLS itself, no trailer
                rest = payload
            else:
                mac.update(payload)
                rest = payload + mac.payload_tag()
        await ch._write(IoVec([memoryview(first)]))

        async def send_rest() -> None:
            await ch._write(IoVec([memoryview(rest)]))

        return send_rest

    async def send_kv(self, transfer: str, blocks: list[int], lo: int, hi: int,
                      payload: bytes) -> None:
        """A whole KV frame."""
        await (await self.hold_kv(transfer, blocks, lo, hi, payload))()

    def close(self) -> None:
        """Drop the connection."""
        self.ch.close()


# -- a receiver on its own thread -----------------------------------------------------------------


class ReceiverThread:
    """A ``Receiver`` served by an event loop on a background thread."""

    def __init__(self, kv: torch.Tensor, layout: KvLayout, config: ReceiverConfig,
                 transports: Callable[[], Sequence[Transport]] | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="kv-receiver",
                                        daemon=True)
        self._thread.start()

        async def make() -> Receiver:
            return Receiver(kv, layout, config, transports() if transports else None)

        self.rx: Receiver = self.run(make())
        self.endpoint: Endpoint = self.run(self.rx.start())

    def run(self, coro: Awaitable[T], timeout: float = 30.0) -> T:
        """Run a coroutine on the receiver's loop and wait for its result."""
        async def wrapped() -> T:
            return await coro

        fut: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(wrapped(), self.loop)
        return fut.result(timeout)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Call a plain function on the receiver's loop thread."""
        async def wrapped() -> T:
            return fn(*args)

        return self.run(wrapped())

    def stop(self) -> None:
        """Close the receiver, stop the loop and join the thread."""
        try:
            self.run(self.rx.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()
