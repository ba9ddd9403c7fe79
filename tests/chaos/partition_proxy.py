"""A TCP proxy the chaos tests partition: it forwards bytes until told to stop, then forwards
nothing, either way, and closes nothing, so each end looks alive at the socket level and hears
nothing, as behind a dead switch; healed, it forwards what it held. Loopback only.

    tests/chaos/test_partition.py            router <-> decode worker (gRPC)
    tests/chaos/test_kv_partition.py         prefill worker <-> decode worker (KV)
"""

from __future__ import annotations

import socket
import threading


class PartitionProxy:
    """A TCP proxy listening on ``listen`` (a loopback host, IPv4 or IPv6, and a port: a free
    one by default) to ``target`` whose forwarding can be stopped and resumed without
    closing any socket (``partition``/``heal``); ``stop`` closes everything. ``address``:
    where it listens, as ``host:port`` (``[v6]:port``)."""

    def __init__(self, target: str | None = None,
                 listen: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        self._target: tuple[str, int] | None = None
        if target is not None:
            self.forward_to(target)
        self._flowing = threading.Event()
        self._flowing.set()
        self._stopped = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        host = listen[0]
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server(listen, family=family)
        port = self._listener.getsockname()[1]
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._spawn(self._accept)

    def forward_to(self, target: str) -> None:
        """Where accepted connections go; set before the first one arrives (a proxy made
        without a target listens first, so its address can be given to the worker it fronts)."""
        host, _, port = target.rpartition(":")
        self._target = (host.strip("[]"), int(port))

    def partition(self) -> None:
        """Stop forwarding, both ways; bytes already read are held, not sent."""
        self._flowing.clear()

    def heal(self) -> None:
        """Forward again, held bytes first (a connection an end closed meanwhile closes)."""
        self._flowing.set()

    def stop(self) -> None:
        """Close the listener and every connection; wait for the forwarding threads."""
        self._stopped = True
        self._flowing.set()
        with self._lock:
            sockets = [self._listener, *self._sockets]
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        for thread in self._threads:
            thread.join(timeout=10)

    def _spawn(self, target, *args) -> None:  # type: ignore[no-untyped-def]
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
                assert self._target is not None, "forward_to() before the first connection"
                upstream = socket.create_connection(self._target)
            except OSError:
                return
            with self._lock:
                self._sockets += [client, upstream]
            self._spawn(self._pump, client, upstream)
            self._spawn(self._pump, upstream, client)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            self._flowing.wait()  # partitioned: hold it (an EOF too) until healed
            if self._stopped:
                return
            try:
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
            except OSError:
                return
