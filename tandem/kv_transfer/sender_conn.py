"""One pooled connection on the sender: many transfers share it, frames interleave whole.

A reader task takes the receiver's replies and routes them by transfer id:
ACK(COMMIT) -> commit succeeds; NACK -> that transfer fails with the matching error; ABORT ->
``TransferAborted(by="receiver")``. When the connection ends, every transfer on it fails with
``ConnectionLost`` and the pool forgets it.

A keepalive task sends a KEEPALIVE, every ``keepalive_s`` (the receiver's ask, from HELLO), for
each open transfer that sent nothing for half of that: the receiver renews its lease on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tandem.kv_transfer.blocks import SendSpan
from tandem.kv_transfer.errors import (
    ChannelClosed,
    ChecksumMismatch,
    ConnectionLost,
    KvTransferError,
    ProtocolError,
    TransferAborted,
    TransferFailed,
    TransferRejected,
)
from tandem.kv_transfer.frames import Header, Kind
from tandem.kv_transfer.handshake import PeerInfo
from tandem.kv_transfer.transport.base import Channel

if TYPE_CHECKING:
    from tandem.kv_transfer.outgoing import OutgoingTransfer

log = logging.getLogger(__name__)


def nack_error(transfer_id: str, header: Header) -> TransferFailed:
    """The typed error for a NACK naming a transfer."""
    code, reason = header["code"], header.get("reason", "")
    if code == "checksum":
        return ChecksumMismatch(transfer_id, reason)
    return TransferRejected(transfer_id, f"{code}: {reason}", code)


class OutboundConnection:
    """A channel to one receiver plus the transfers currently using it."""

    def __init__(self, channel: Channel, info: PeerInfo, frame_bytes: int,
                 on_closed: Callable[[OutboundConnection], None]) -> None:
        self.channel = channel
        self.max_frame_bytes = max(1, min(frame_bytes, info.max_payload))
        self.transfers: dict[str, OutgoingTransfer] = {}
        self._on_closed = on_closed
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.keepalive_s = info.keepalive_s
        self.max_stripes = info.max_stripes  # connections one transfer may span there
        loop = asyncio.get_running_loop()
        self._reader = loop.create_task(self._read_loop())
        self._keepalive = loop.create_task(self._keepalive_loop())

    @property
    def load(self) -> int:
        """Transfers in flight on this connection."""
        return len(self.transfers)

    @property
    def closed(self) -> bool:
        """True once the connection has ended."""
        return self._closed

    @property
    def buffered_bytes(self) -> int:
        """Memory held for this connection (the shm segment mapping)."""
        return self.channel.buffered_bytes

    async def send(self, header: Header, span: SendSpan | None = None) -> None:
        """Send one frame (whole; see ``Channel.send``)."""
        await self.channel.send(header, span)

    def send_soon(self, header: Header) -> None:
        """Send a frame in the background (best effort: ABORT after a local failure)."""
        async def _send() -> None:
            with contextlib.suppress(ChannelClosed):
                await self.channel.send(header)

        task = asyncio.get_running_loop().create_task(_send())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read_loop(self) -> None:
        error: KvTransferError = ChannelClosed("connection closed")
        try:
            while True:
                header = await self.channel.recv()
                kind, tid = header["kind"], header.get("transfer")
                transfer = self.transfers.get(tid) if isinstance(tid, str) else None
                if kind == Kind.ACK and header["ref"] == Kind.COMMIT:
                    if transfer is not None:
                        transfer._on_committed()
                elif kind == Kind.NACK:
                    if tid is None:
                        raise ProtocolError(f"receiver refused the connection: {header['code']}"
                                            f": {header.get('reason', '')}")
                    if transfer is not None:
                        transfer._on_failed(nack_error(tid, header))
                elif kind == Kind.ABORT:
                    if transfer is not None:
                        transfer._on_failed(TransferAborted(
                            tid, header.get("reason", "aborted by receiver"), by="receiver"))
                else:
                    raise ProtocolError(f"unexpected {Kind(kind).name} from the receiver")
        except (ChannelClosed, ProtocolError) as exc:
            error = exc
            if isinstance(exc, ProtocolError):
                log.warning("closing connection to %s: %s", self.channel.peer, exc)
        finally:
            self.close(str(error))

    async def _keepalive_loop(self) -> None:
        """Renew the receiver's lease on quiet transfers (see the module docstring)."""
        every = self.keepalive_s
        try:
            while True:
                await asyncio.sleep(every)
                now = time.monotonic()
                for transfer in list(self.transfers.values()):
                    if transfer.needs_keepalive(now, every / 2):
                        transfer.last_sent = now
                        await self.channel.send({"kind": Kind.KEEPALIVE,
                                                 "transfer": transfer.transfer_id})
        except ChannelClosed:
            pass  # the reader sees the same and closes the connection
        except Exception:  # a bug: without keepalives the leases would lapse, so say it
            log.exception("keepalives to %s failed", self.channel.peer)
            self.close("keepalive failed")

    def close(self, reason: str = "closed by the sender") -> None:
        """Close the channel and fail every transfer still on it."""
        if self._closed:
            return
        self._closed = True
        self.channel.close()
        for tid, transfer in list(self.transfers.items()):
            transfer._on_failed(ConnectionLost(tid, reason))
        self.transfers.clear()
        for task in (self._reader, self._keepalive):
            if not task.done() and task is not asyncio.current_task():
                task.cancel()
        self._on_closed(self)

    async def wait_closed(self) -> None:
        """Wait for the reader and keepalive tasks to finish after ``close``."""
        for task in (self._reader, self._keepalive):
            with contextlib.suppress(asyncio.CancelledError):
                await task
