"""Per-destination connection pooling for the sender.

Up to ``max_connections_per_endpoint`` connections per receiver endpoint; a transfer takes an
idle one, else opens a new one while under the cap, else shares the least loaded (frames from
different transfers interleave whole). A connection is dialled with the first transport, in the
sender's preference order, that reaches the endpoint; a failed connect falls back to the next
one, a refused handshake (layout, auth, version, busy) does not.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Sequence

from tandem.kv_transfer.blocks import KvBlocks
from tandem.kv_transfer.codecs import codec as codec_named
from tandem.kv_transfer.config import SenderConfig
from tandem.kv_transfer.endpoint import Endpoint
from tandem.kv_transfer.errors import ChannelClosed, NoRouteError
from tandem.kv_transfer.handshake import client_handshake
from tandem.kv_transfer.layout import KvLayout
from tandem.kv_transfer.reshard import RouteHello
from tandem.kv_transfer.sender_conn import OutboundConnection
from tandem.kv_transfer.transport.base import Transport

log = logging.getLogger(__name__)


class ConnectionPool:
    """Open, authenticated connections by endpoint."""

    def __init__(self, blocks: KvBlocks, layout: KvLayout, config: SenderConfig,
                 transports: Sequence[Transport], route: RouteHello | None = None) -> None:
        """``route``: every connection carries this route of a re-sharded push (``blocks``
        and ``layout`` are then the route's head window)."""
        self._blocks = blocks
        self._route = route
        self._layout = layout
        self._config = config
        self._transports = list(transports)
        self._codec = codec_named(config.codec)
        self._conns: dict[str, list[OutboundConnection]] = collections.defaultdict(list)
        self._locks: dict[str, asyncio.Lock] = collections.defaultdict(asyncio.Lock)

    def connections(self) -> list[OutboundConnection]:
        """Every open connection."""
        return [c for conns in self._conns.values() for c in conns if not c.closed]

    @property
    def _cap(self) -> int:
        """Connections per endpoint: the configured cap, or a transfer's stripes if more."""
        return max(self._config.max_connections_per_endpoint, self._config.stripes)

    def _pick(self, key: str, allow_new: bool,
              exclude: Sequence[OutboundConnection] = ()) -> OutboundConnection | None:
        live = [c for c in self._conns[key] if not c.closed]
        others = [c for c in live if c not in exclude]
        if not others:
            return None
        best = min(others, key=lambda c: c.load)
        if best.load == 0 or not allow_new or len(live) >= self._cap:
            return best
        return None

    async def acquire_stripes(self, endpoint: Endpoint, timeout: float) -> list[OutboundConnection]:
        """Distinct connections for one transfer: ``SenderConfig.stripes`` of them over TCP,
        as many as the receiver allows (its ACK's ``max_stripes``); one otherwise. Raises as
        ``acquire``."""
        first = await self.acquire(endpoint, timeout)
        want = min(self._config.stripes, first.max_stripes)
        if want <= 1 or first.channel.transport != "tcp":
            return [first]
        key = endpoint.key()
        out = [first]
        async with self._locks[key]:
            while len(out) < want:
                conn = self._pick(key, allow_new=True, exclude=out)
                if conn is None:
                    conn = await self._dial(endpoint, timeout)
                    self._conns[key].append(conn)
                if conn.channel.transport != "tcp":
                    break
                out.append(conn)
        return out

    async def acquire(self, endpoint: Endpoint, timeout: float) -> OutboundConnection:
        """A connection to ``endpoint`` (pooled or new); raises ``NoRouteError``,
        ``ChannelClosed`` or a ``HandshakeError``."""
        key = endpoint.key()
        conn = self._pick(key, allow_new=True)
        if conn is not None:
            return conn
        async with self._locks[key]:
            conn = self._pick(key, allow_new=True)
            if conn is not None:
                return conn
            conn = await self._dial(endpoint, timeout)
            self._conns[key].append(conn)
            return conn

    async def _dial(self, endpoint: Endpoint, timeout: float) -> OutboundConnection:
        cfg = self._config
        errors: list[str] = []
        for transport in self._transports:
            address = endpoint.address(transport.name)
            if address is None or not transport.reaches(endpoint, self._blocks):
                continue
            try:
                channel = await transport.connect(address, self._blocks, timeout)
            except ChannelClosed as exc:
                log.info("%s unreachable (%s); trying the next transport", address, exc)
                errors.append(str(exc))
                continue
            try:
                info = await asyncio.wait_for(
                    client_handshake(channel, self._layout, cfg.secret, self._codec,
                                     self._route), timeout)
            except asyncio.TimeoutError:
                channel.close()
                raise ChannelClosed(f"handshake with {address} timed out") from None
            except BaseException:
                channel.close()
                raise
            if info.codec is not self._codec and transport.name == "tcp":
                log.info("%s: KV codec %r not accepted by the receiver; payloads go raw",
                         address, self._codec.name)
            return OutboundConnection(channel, info, cfg.frame_bytes, self._forget)
        if not errors:
            raise NoRouteError(f"no transport reaches {endpoint.encode()}")
        raise ChannelClosed("; ".join(errors))

    def _forget(self, conn: OutboundConnection) -> None:
        for key, conns in list(self._conns.items()):
            if conn in conns:
                conns.remove(conn)
                if not conns:
                    del self._conns[key]

    async def close(self) -> None:
        """Close every connection (their transfers fail with ``ConnectionLost``)."""
        conns = self.connections()
        for conn in conns:
            conn.close("sender closing")
        for conn in conns:
            await conn.wait_closed()
