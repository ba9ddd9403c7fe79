"""The prefill side: push a request's KV blocks into a decode worker's reservation.

    t = await sender.open(tid, endpoint, src_ids, dst_ids, deadline)   # BEGIN (pooled conn)
    for layer in range(L):
        compute(layer)                      # on GPU: synchronise before pushing
        t.push(layer, layer + 1)            # ships while the next layer computes
    await t.commit(first_token, logprob)    # COMMIT, wait for ACK; or: await t.abort(reason)

``open`` may come before the source blocks exist (``src_ids=None``, then ``t.set_source``
before the first push): the reservation is bound at once, and the connection's KEEPALIVEs
renew its lease until the first layer is computed (a prefill queued behind others), up to
``deadline``.

The source blocks must stay untouched until ``commit``/``abort`` returns or a call raises; after
that the sender holds nothing for the transfer. Every method runs on one event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tandem.kv_transfer.blocks import KvBlocks
from tandem.kv_transfer.config import SenderConfig
from tandem.kv_transfer.endpoint import Endpoint
from tandem.kv_transfer.errors import (
    ChannelClosed,
    ConnectionLost,
    DeadlineExceeded,
    TransferFailed,
    TransferSpecError,
)
from tandem.kv_transfer.frames import Kind
from tandem.kv_transfer.layout import KvLayout
from tandem.kv_transfer.outgoing import OutgoingTransfer, check_source
from tandem.kv_transfer.pool import ConnectionPool
from tandem.kv_transfer.reshard import GroupKv, Route, RouteHello, route_layout
from tandem.kv_transfer.transport import sender_transports
from tandem.kv_transfer.transport.base import Transport


@dataclass(frozen=True, slots=True)
class SenderStats:
    """What the sender holds right now; every test ends with ``transfers == 0``."""

    transfers: int
    connections: int
    buffered_bytes: int
    shm_slots_in_use: int


class Sender:
    """Pushes KV blocks of ``kv`` to receivers (see the module docstring)."""

    def __init__(self, kv: torch.Tensor, layout: KvLayout, config: SenderConfig,
                 transports: Sequence[Transport] | None = None, *,
                 staged: bool | None = None, group: GroupKv | None = None,
                 rank: int = 0) -> None:
        """``group``, ``rank``: this cache as rank ``rank`` of a tensor-parallel group, whose
        routes to another group's ranks ``open(route=...)`` pushes (a one-process cache is a
        group of one by default)."""
        self.blocks = KvBlocks(kv, layout, staged=staged)
        self.layout = layout
        self.config = config
        self.group = group if group is not None or layout.tensor_parallel_size else \
            GroupKv.single(layout)
        self.rank = rank
        self._transports = (list(transports) if transports is not None
                            else sender_transports(config, self.blocks.is_cuda))
        self._pool = ConnectionPool(self.blocks, layout, config, self._transports)
        self._route_pools: dict[tuple[int, int], ConnectionPool] = {}
        # by transfer id, and the decode rank for a route (one transfer id, several routes)
        self._transfers: dict[tuple[str, int], OutgoingTransfer] = {}

    def _pool_for(self, route: Route | None) -> tuple[ConnectionPool, KvBlocks]:
        """The connections (and the cache window) a route's frames go by."""
        if route is None:
            return self._pool, self.blocks
        if self.group is None or route.src != self.rank:
            raise TransferSpecError(f"route {route} does not start at this sender's rank "
                                    f"{self.rank}")
        key = (route.start, route.stop)
        window = self.blocks.window(route.src_offset, route.src_offset + route.heads)
        pool = self._route_pools.get(key)
        if pool is None:
            # connections of a route carry its heads only; CUDA IPC maps whole caches
            byte_transports = [t for t in self._transports if t.name != "cuda_ipc"]
            pool = self._route_pools[key] = ConnectionPool(
                window, route_layout(self.group, self.rank, route.start, route.stop),
                self.config, byte_transports, RouteHello(self.group, route.start, route.stop))
        return pool, window

    def _check(self, key: tuple[str, int], src: list[int] | None, dst: list[int]) -> None:
        transfer_id = key[0]
        if not transfer_id or len(transfer_id) > 128:
            raise TransferSpecError("transfer id must be 1..128 characters")
        if key in self._transfers:
            raise TransferSpecError(f"transfer {transfer_id!r} is already in flight")
        if not dst:
            raise TransferSpecError("a transfer needs at least one destination block")
        if src is not None:
            check_source(self.blocks, src, dst)
        if min(dst) < 0 or max(dst) >= 1 << 31 or len(set(dst)) != len(dst):
            raise TransferSpecError("destination ids must be unique and in 0..2**31-1")
        if self.layout.payload_bytes(1, 1) > self.config.frame_bytes:
            raise TransferSpecError("one block is larger than SenderConfig.frame_bytes")

    async def open(self, transfer_id: str, endpoint: Endpoint,
                   src_block_ids: Sequence[int] | None, dst_block_ids: Sequence[int],
                   deadline: float, adapter: str = "", *, route: Route | None = None,
                   parts: int = 1) -> OutgoingTransfer:
        """Start a transfer: pooled connection, BEGIN; returns the handle to push layers with.
        ``src_block_ids=None``: bind the reservation now, name the sources later
        (``OutgoingTransfer.set_source``).

        ``deadline`` is a ``time.monotonic()`` instant bounding every later wait; BEGIN tells
        the receiver, which renews the lease no further. ``adapter``: the LoRA adapter
        identity the KV is computed under ("": the base model), checked by the receiver
        against its reservation's. Raises
        ``TransferSpecError`` (bad ids), ``NoRouteError``, a ``HandshakeError``
        (layout/auth/version/busy) or a ``TransferFailed`` (``ConnectionLost``,
        ``DeadlineExceeded``).

        ``route``: push only that route of a re-sharded handoff (its heads, from this rank's
        cache, over connections that state it at HELLO); ``parts``: how many routes fill
        the receiver's reservation (each BEGINs with it; one of them commits, the others
        ``finish_part``).
        """
        src = None if src_block_ids is None else [int(b) for b in src_block_ids]
        dst = [int(b) for b in dst_block_ids]
        key = (transfer_id, -1 if route is None else route.dst)
        self._check(key, src, dst)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded(transfer_id, "deadline passed before open")
        try:
            pool, blocks = self._pool_for(route)
            conns = await pool.acquire_stripes(
                endpoint, min(remaining, self.config.connect_timeout_s))
        except ChannelClosed as exc:
            raise ConnectionLost(transfer_id, f"cannot connect: {exc}") from exc
        if key in self._transfers:  # opened concurrently while we dialled
            raise TransferSpecError(f"transfer {transfer_id!r} is already in flight")
        transfer = OutgoingTransfer(blocks, conns, transfer_id, src, dst, deadline,
                                    self._forget)
        for conn in conns:
            conn.transfers[transfer_id] = transfer
        self._transfers[key] = transfer
        ttl_ms = int(max(0.0, deadline - time.monotonic()) * 1000)
        begin: dict[str, object] = {"kind": Kind.BEGIN, "transfer": transfer_id, "blocks": dst,
                                    "ttl_ms": ttl_ms}
        if len(conns) > 1:  # striped: a BEGIN on each connection, any may arrive first
            begin["stripes"] = len(conns)
        if adapter:
            begin["adapter"] = adapter
        if parts > 1:
            begin["parts"] = parts
        try:
            await transfer._bounded(asyncio.gather(*(c.send(begin) for c in conns)))
            transfer.last_sent = time.monotonic()
        except TransferFailed as exc:
            transfer._on_failed(exc)
            raise
        return transfer

    async def send(self, transfer_id: str, endpoint: Endpoint, src_block_ids: Sequence[int],
                   dst_block_ids: Sequence[int], *, first_token: int, logprob: float,
                   deadline: float) -> None:
        """Open, push every layer, commit: the whole transfer when the KV is already computed."""
        transfer = await self.open(transfer_id, endpoint, src_block_ids, dst_block_ids, deadline)
        try:
            transfer.push(0, self.layout.num_layers)
            await transfer.commit(first_token, logprob)
        except BaseException:
            await transfer.abort("sender failed")
            raise

    def _forget(self, transfer: OutgoingTransfer) -> None:
        for key, t in list(self._transfers.items()):
            if t is transfer:
                del self._transfers[key]

    def stats(self) -> SenderStats:
        """Transfers in flight, open connections, and memory held for them."""
        conns = [c for p in (self._pool, *self._route_pools.values())
                 for c in p.connections()]
        return SenderStats(
            transfers=len(self._transfers), connections=len(conns),
            buffered_bytes=sum(c.buffered_bytes for c in conns),
            shm_slots_in_use=sum(getattr(c.channel, "slots_in_use", 0) for c in conns))

    async def close(self) -> None:
        """Close every connection; transfers still in flight fail with ``ConnectionLost``."""
        for pool in (self._pool, *self._route_pools.values()):
            await pool.close()
