"""At most ``per_address`` open HTTP connections per client address.

Each connection is cheap, but not free (a socket, a file descriptor, aiohttp's per-connection
state), and the per-connection bound on requests (tandem/router/client_limits.py) means
nothing if one host can open connections without end. A connection over the cap is answered
``429`` with a Retry-After and closed before aiohttp sees it; every other connection is handed
to aiohttp untouched (the transport is given straight to its protocol).

    AddressConnections   the bookkeeping: open transports by address (a closed one is pruned
                         the next time its address connects, or in a periodic sweep)
    CappedSite           aiohttp's TCP site with that check in front of its protocol

Behind a proxy every client shares the proxy's address: raise the cap there, or set 0.
"""

from __future__ import annotations

import asyncio
import json
import math
import ssl
from typing import Any

from aiohttp import web

from tandem.router.http.errors import error_body


class AddressConnections:
    """Open transports by peer address, against ``per_address`` (0: no bound)."""

    def __init__(self, per_address: int) -> None:
        self.per_address = per_address
        self._open: dict[str, list[asyncio.BaseTransport]] = {}
        self._sweep_at = 1024  # addresses held before closed entries are swept out
        self.rejected = 0

    def admit(self, address: str, transport: asyncio.BaseTransport) -> bool:
        """Count ``transport`` for ``address`` unless the address is at its cap."""
        if not self.per_address:
            return True
        held = [t for t in self._open.get(address, ()) if not t.is_closing()]
        if len(held) >= self.per_address:
            self._open[address] = held
            self.rejected += 1
            return False
        held.append(transport)
        self._open[address] = held
        if len(self._open) > self._sweep_at:
            self._sweep()
        return True

    def open_count(self, address: str) -> int:
        """Connections ``address`` holds open now."""
        return sum(1 for t in self._open.get(address, ()) if not t.is_closing())

    def _sweep(self) -> None:
        for address in list(self._open):
            held = [t for t in self._open[address] if not t.is_closing()]
            if held:
                self._open[address] = held
            else:
                del self._open[address]
        self._sweep_at = max(1024, 2 * len(self._open))


_LINGER_S = 1.0  # a refused connection's request is read (and dropped) this long at most


class _Doorman(asyncio.Protocol):
    """The first protocol of every connection: admits it (and steps aside) or refuses it.

    A refusal is written, the write side shut, and what the client still sends read and
    dropped until it closes (or ``_LINGER_S``): closing on unread data would reset the
    connection, and the client might lose the answer."""

    def __init__(self, site: CappedSite) -> None:
        self._site = site
        self._linger: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if self._site.connections.admit(address, transport):
            inner = self._site.protocol()
            transport.set_protocol(inner)
            inner.connection_made(transport)
            return
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(self._site.refusal)
        if transport.can_write_eof():
            transport.write_eof()
            self._linger = asyncio.get_running_loop().call_later(_LINGER_S, transport.close)
        else:
            transport.close()

    def data_received(self, data: bytes) -> None:
        pass  # a refused connection's request: dropped, the answer is already on its way

    def connection_lost(self, exc: Exception | None) -> None:
        if self._linger is not None:
            self._linger.cancel()


class CappedSite(web.BaseSite):
    """``web.TCPSite``'s job (listen on ``host:port``) with AddressConnections in front."""

    __slots__ = ("_host", "_port", "connections", "refusal", "bound_port")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, per_address: int,
                 retry_after_ms: int, ssl_context: ssl.SSLContext | None = None) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._host = host
        self._port = port
        self.connections = AddressConnections(per_address)
        self.refusal = _refusal(per_address, retry_after_ms)
        self.bound_port = 0

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self.bound_port or self._port}"

    def protocol(self) -> Any:
        """A new aiohttp protocol for an admitted connection."""
        server = self._runner.server
        assert server is not None
        return server()

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Doorman(self), self._host, self._port, ssl=self._ssl_context,
            backlog=self._backlog, reuse_port=False)
        self.bound_port = int(self._server.sockets[0].getsockname()[1])


def _refusal(per_address: int, retry_after_ms: int) -> bytes:
    """The whole HTTP response a connection over the cap gets."""
    body = json.dumps(error_body(
        429, f"client limit: {per_address} connections open from this address; retry when "
        "one closes", code="too_many_connections")).encode()
    head = (f"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"Retry-After: {max(1, math.ceil(retry_after_ms / 1000))}\r\n"
            f"Retry-After-Ms: {retry_after_ms}\r\nConnection: close\r\n\r\n")
    return head.encode() + body
