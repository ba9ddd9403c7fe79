"""Where a tensor-parallel decode group takes KV: every rank's endpoint and head ranges, as the
one ``kv_endpoint`` string its rank 0 publishes through the router.

    "tpgroup:" + base64url(msgpack {"group": GroupKv.to_wire(), "ranks": [Endpoint.encode()]})

A prefill worker reads it (``parse``) to route each head slice to the decode rank that holds
it (tandem/kv_transfer/reshard.py); a plain ``Endpoint.encode()`` string is a group of one.
Parsed as hostile input: bounded size, exact types, one endpoint per rank.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

import msgpack

from tandem.kv_transfer.endpoint import Endpoint
from tandem.kv_transfer.errors import ConfigError, KvTransferError
from tandem.kv_transfer.reshard import GroupKv

PREFIX = "tpgroup:"
MAX_CHARS = 1 << 16  # a group of 1,024 ranks with long endpoints stays well below


@dataclass(frozen=True, slots=True)
class GroupEndpoint:
    """A decode group: its cache split (``group``) and rank r's endpoint at ``ranks[r]``."""

    group: GroupKv
    ranks: tuple[Endpoint, ...]

    def __post_init__(self) -> None:
        if len(self.ranks) != self.group.world:
            raise ConfigError(f"{len(self.ranks)} endpoints for a group of {self.group.world}")

    def encode(self) -> str:
        """The published string (the inverse of ``decode``)."""
        body = msgpack.packb({"group": self.group.to_wire(),
                              "ranks": [e.encode() for e in self.ranks]})
        return PREFIX + base64.urlsafe_b64encode(body).decode("ascii")

    @classmethod
    def decode(cls, text: str) -> GroupEndpoint:
        """Parse ``encode``'s output; ConfigError on anything else."""
        if not text.startswith(PREFIX) or len(text) > MAX_CHARS:
            raise ConfigError("not a KV group endpoint, or over its size limit")
        try:
            data = msgpack.unpackb(base64.urlsafe_b64decode(text[len(PREFIX):]),
                                   strict_map_key=True)
        except (binascii.Error, ValueError, msgpack.UnpackException) as exc:
            raise ConfigError(f"bad KV group endpoint: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("ranks"), list) \
                or not all(isinstance(e, str) for e in data["ranks"]):
            raise ConfigError("bad KV group endpoint: no list of rank endpoints")
        try:
            group = GroupKv.from_wire(data.get("group"))
        except KvTransferError as exc:
            raise ConfigError(f"bad KV group endpoint: {exc}") from None
        return cls(group, tuple(Endpoint.decode(e) for e in data["ranks"]))

    @staticmethod
    def is_group(text: str) -> bool:
        """Whether ``text`` names a group (else an ``Endpoint.encode()`` string)."""
        return text.startswith(PREFIX)
