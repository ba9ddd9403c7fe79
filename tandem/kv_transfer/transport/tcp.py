"""TCP: the default transport and the only one that crosses hosts.

Plain TCP uses ``SocketChannel`` (``sendmsg``/``recvmsg_into``, ``TCP_NODELAY``, 4 MiB kernel
buffers). With a ``TlsConfig`` both ends use asyncio's TLS streams (``StreamChannel``).
"""

from __future__ import annotations

import asyncio
import socket
import ssl

from tandem.kv_transfer.blocks import KvBlocks
from tandem.kv_transfer.config import Limits, TlsConfig
from tandem.kv_transfer.endpoint import Endpoint, split_host_port
from tandem.kv_transfer.errors import ChannelClosed
from tandem.kv_transfer.frames import HeaderCodec
from tandem.kv_transfer.transport.base import Channel, Handler, Listener, Transport
from tandem.kv_transfer.transport.sockets import SocketChannel, SocketListener, tune_socket
from tandem.kv_transfer.transport.streams import StreamChannel


def server_tls_context(tls: TlsConfig) -> ssl.SSLContext:
    """Receiver-side context; with ``ca_file`` the sender must present a certificate."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls.cert_file is None:
        raise ChannelClosed("TLS receiver needs cert_file")
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.ca_file is not None:
        ctx.load_verify_locations(tls.ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_tls_context(tls: TlsConfig) -> ssl.SSLContext:
    """Sender-side context; checks the receiver against ``ca_file`` (system CAs otherwise)."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = tls.server_name is not None
    if tls.cert_file is not None:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    return ctx


class _TlsListener(Listener):
    def __init__(self, server: asyncio.Server, address: str) -> None:
        self.transport = "tcp"
        self.address = address
        self._server = server

    async def close(self) -> None:
        # Stop accepting only: the receiver closes the connections itself (wait_closed would
        # wait for them on Python >= 3.12).
        self._server.close()


class TcpTransport(Transport):
    """TCP, optionally with TLS."""

    name = "tcp"

    def __init__(self, limits: Limits, *, socket_buffer_bytes: int = 4 << 20,
                 tls: TlsConfig | None = None, host: str = "127.0.0.1", port: int = 0,
                 advertise_host: str | None = None) -> None:
        self._codec = HeaderCodec(limits)
        self._max_payload = limits.max_payload_bytes
        self._buf = socket_buffer_bytes
        self._tls = tls
        self._host, self._port = host, port
        self._advertise = advertise_host

    def _address(self, sock_port: int) -> str:
        host = self._advertise or self._host
        return f"[{host}]:{sock_port}" if ":" in host else f"{host}:{sock_port}"

    async def listen(self, handler: Handler, blocks: KvBlocks) -> Listener:
        if self._tls is not None:
            ctx = server_tls_context(self._tls)

            async def on_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                peer = writer.get_extra_info("peername")
                await handler(StreamChannel(reader, writer, self._codec, self._max_payload,
                                            "tcp", f"{peer[0]}:{peer[1]}"))

            server = await asyncio.start_server(on_stream, self._host, self._port, ssl=ctx)
            port = server.sockets[0].getsockname()[1]
            return _TlsListener(server, self._address(port))
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, self._port))
        sock.listen(256)

        def make(conn: socket.socket, peer: str) -> Channel:
            tune_socket(conn, self._buf)
            return SocketChannel(conn, self._codec, self._max_payload, "tcp", peer)

        return SocketListener(sock, "tcp", self._address(sock.getsockname()[1]), make, handler)

    def reaches(self, endpoint: Endpoint, blocks: KvBlocks) -> bool:
        return endpoint.address("tcp") is not None

    async def connect(self, address: str, blocks: KvBlocks, timeout: float) -> Channel:
        host, port = split_host_port(address)
        try:
            if self._tls is not None:
                ctx = client_tls_context(self._tls)
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port, ssl=ctx,
                                            server_hostname=self._tls.server_name or host),
                    timeout)
                return StreamChannel(reader, writer, self._codec, self._max_payload, "tcp",
                                     address)
            return await asyncio.wait_for(self._connect_raw(host, port), timeout)
        except (OSError, asyncio.TimeoutError, ssl.SSLError) as exc:
            raise ChannelClosed(f"tcp connect to {address}: {exc!r}") from exc

    async def _connect_raw(self, host: str, port: int) -> Channel:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, type_, proto, _, addr = infos[0]
        sock = socket.socket(family, type_, proto)
        try:
            sock.setblocking(False)
            tune_socket(sock, self._buf)
            await loop.sock_connect(sock, addr)
        except BaseException:
            sock.close()
            raise
        return SocketChannel(sock, self._codec, self._max_payload, "tcp", f"{host}:{port}")
