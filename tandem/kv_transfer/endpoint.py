"""Where a receiver can be reached: its host id plus one address per transport.

The decode worker publishes ``Endpoint.encode()`` (a short string) through the router; the
prefill worker decodes it and the sender picks a transport. ``host_id`` is the kernel boot id, so
two processes on one machine (containers included) see the same value and may use shared memory.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from functools import lru_cache

from tandem.kv_transfer.errors import ConfigError

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,31}$")


@lru_cache(maxsize=1)
def local_host_id() -> str:
    """This machine's identity: the kernel boot id, else the hostname."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return socket.gethostname()


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A receiver's addresses, e.g. ``(("tcp", "10.0.0.7:7100"), ("shm", "/tmp/kv-1.sock"))``."""

    host_id: str
    addresses: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        if not self.host_id or any(c in self.host_id for c in "|,="):
            raise ConfigError(f"bad host id {self.host_id!r}")
        for name, address in self.addresses:
            if not _NAME.match(name) or not address or any(c in address for c in "|,"):
                raise ConfigError(f"bad endpoint address {name!r}={address!r}")

    def address(self, transport: str) -> str | None:
        """The address for ``transport``, or None when the receiver does not listen on it."""
        for name, address in self.addresses:
            if name == transport:
                return address
        return None

    @property
    def same_host(self) -> bool:
        """True when the receiver runs on this machine."""
        return self.host_id == local_host_id()

    def encode(self) -> str:
        """``host_id|tcp=127.0.0.1:7100,shm=/tmp/x.sock`` (the inverse of ``decode``)."""
        return self.host_id + "|" + ",".join(f"{n}={a}" for n, a in self.addresses)

    @classmethod
    def decode(cls, text: str) -> Endpoint:
        """Parse ``encode``'s output; raise ``ConfigError`` on anything else."""
        host_id, sep, rest = text.partition("|")
        if not sep:
            raise ConfigError(f"bad endpoint {text!r}")
        pairs = []
        for item in filter(None, rest.split(",")):
            name, eq, address = item.partition("=")
            if not eq:
                raise ConfigError(f"bad endpoint item {item!r}")
            pairs.append((name, address))
        return cls(host_id, tuple(pairs))

    def key(self) -> str:
        """A stable key for connection pooling."""
        return self.encode()


def split_host_port(address: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` to ``(host, port)``."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"bad tcp address {address!r}")
    return host.strip("[]"), int(port)
