"""One transfer on the sender: queued layer ranges, a pump task, then COMMIT or ABORT.

    push(0,1) push(1,2) ... push(L-1,L)       (each returns at once; layer i+1 computes meanwhile)
        \\__ pump task: frames in order -> connection
    commit(tok, lp): wait for the pump, COMMIT, wait for its ACK     -> done, nothing held
    abort(reason):   let the frame on the wire finish, drop the queue, ABORT -> done

Any failure (NACK, receiver ABORT, lost connection, deadline) ends the transfer at once; the
error is raised by the next ``push``/``flush``/``commit`` call, and only after the pump has
stopped reading the source blocks.

While it is open and quiet (no frame for a while: the prefill is queued or computing), its
connection sends a KEEPALIVE for it (``needs_keepalive``), which renews the receiver's lease.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

from tandem.kv_transfer.blocks import KvBlocks, SendSpan
from tandem.kv_transfer.errors import (
    ChannelClosed,
    ConnectionLost,
    DeadlineExceeded,
    TransferAborted,
    TransferFailed,
    TransferSpecError,
)
from tandem.kv_transfer.frames import Header, Kind, abort

if TYPE_CHECKING:
    from tandem.kv_transfer.sender_conn import OutboundConnection

T = TypeVar("T")
log = logging.getLogger(__name__)
ABORT_GRACE_S = 1.0


def check_source(blocks: KvBlocks, src: list[int], dst: list[int]) -> None:
    """Raise ``TransferSpecError`` unless ``src`` pairs with ``dst`` and addresses ``blocks``."""
    if len(src) != len(dst):
        raise TransferSpecError(f"{len(src)} source blocks but {len(dst)} destinations")
    blocks.check_span(0, blocks.layout.num_layers, src)


class OutgoingTransfer:
    """Handle returned by ``Sender.open``; see the module docstring."""

    def __init__(self, blocks: KvBlocks, conns: Sequence[OutboundConnection], transfer_id: str,
                 src_ids: list[int] | None, dst_ids: list[int], deadline: float,
                 on_end: Callable[[OutgoingTransfer], None]) -> None:
        self.blocks = blocks
        self.conn = conns[0]  # BEGIN's first, COMMIT's and ABORT's connection
        self.stripes = list(conns)  # every connection its KV frames go over
        self.transfer_id = transfer_id
        self.src_ids = src_ids
        self.dst_ids = dst_ids
        self.deadline = deadline
        self.last_sent = time.monotonic()  # of its last frame (BEGIN, KV, KEEPALIVE)
        self._on_end = on_end
        self._ending = False  # COMMIT or ABORT is being sent: no more KEEPALIVEs
        self._queue: collections.deque[tuple[int, int]] = collections.deque()
        self._pump: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._ack: asyncio.Future[None] | None = None
        self._error: TransferFailed | None = None
        self._committed = False
        self._unregistered = False
        self._ended = asyncio.Event()

    # -- state --------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """True once committed or failed."""
        return self._committed or self._error is not None

    @property
    def error(self) -> TransferFailed | None:
        """Why the transfer failed, if it did."""
        return self._error

    async def wait_ended(self) -> TransferFailed | None:
        """Wait until the transfer commits (returns None) or fails (returns why). Lets the
        prefill worker stop computing for a request whose receiver gave up."""
        await self._ended.wait()
        return self._error

    def _pumping(self) -> bool:
        return self._pump is not None and not self._pump.done()

    def needs_keepalive(self, now: float, quiet_s: float) -> bool:
        """True when the transfer is open, before its deadline, and no frame of it went out
        for ``quiet_s`` seconds (the connection then sends a KEEPALIVE)."""
        return (not self.done and not self._ending and now < self.deadline
                and now - self.last_sent >= quiet_s)

    def set_source(self, src_ids: list[int]) -> None:
        """Name the source blocks of a transfer opened without them (before the first push)."""
        src = [int(b) for b in src_ids]
        if self.src_ids is not None and self.src_ids != src:
            raise TransferSpecError(f"transfer {self.transfer_id!r} already has its sources")
        check_source(self.blocks, src, self.dst_ids)
        self.src_ids = src

    def _unregister(self) -> None:
        """Forget the transfer once it is over and the pump no longer reads the source."""
        if self._unregistered or not self.done:
            return
        if self._pumping() and self._pump is not asyncio.current_task():
            return  # the pump's finally comes back here
        self._unregistered = True
        for conn in self.stripes:
            conn.transfers.pop(self.transfer_id, None)
        self._on_end(self)
        self._ended.set()

    def _on_failed(self, exc: TransferFailed, tell_receiver: bool = False) -> None:
        """Called by the connection's reader (NACK, ABORT, lost) or locally."""
        if self.done:
            return
        self._error = exc
        self._queue.clear()
        if self._ack is not None and not self._ack.done():
            self._ack.set_exception(exc)
            self._ack.exception()  # retrieved: commit() re-raises self._error
        if tell_receiver and not self.conn.closed:
            self.conn.send_soon(abort(self.transfer_id, str(exc)))
        self._unregister()

    def _on_committed(self) -> None:
        if self._ack is not None and not self._ack.done():
            self._ack.set_result(None)

    # -- deadline -----------------------------------------------------------------------------

    async def _bounded(self, aw: Awaitable[T]) -> T:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            if asyncio.iscoroutine(aw):
                aw.close()
            raise DeadlineExceeded(self.transfer_id, "deadline passed")
        try:
            return await asyncio.wait_for(aw, remaining)
        except asyncio.TimeoutError:
            raise DeadlineExceeded(self.transfer_id, "deadline passed") from None
        except ChannelClosed as exc:
            raise ConnectionLost(self.transfer_id, str(exc)) from exc

    # -- sending ------------------------------------------------------------------------------

    def push(self, lo: int, hi: int) -> None:
        """Queue layers ``[lo, hi)`` for sending and return at once."""
        if self._error is not None:
            raise self._error
        if self._committed:
            raise TransferSpecError(f"transfer {self.transfer_id!r} already committed")
        if not 0 <= lo < hi <= self.blocks.layout.num_layers:
            raise TransferSpecError(f"layer range [{lo}, {hi}) outside the layout")
        if self.src_ids is None:
            raise TransferSpecError(f"transfer {self.transfer_id!r} has no source blocks yet")
        self._queue.append((lo, hi))
        self._idle.clear()
        if not self._pumping():
            self._pump = asyncio.get_running_loop().create_task(self._run_pump())

    async def send_layers(self, lo: int, hi: int) -> None:
        """Queue layers ``[lo, hi)`` and wait until everything queued is on the wire."""
        self.push(lo, hi)
        await self.flush()

    async def flush(self) -> None:
        """Wait until the queue is sent; raise the transfer's error if it failed."""
        if not self._idle.is_set():
            try:
                await self._bounded(self._idle.wait())
            except TransferFailed as exc:
                self._on_failed(exc, tell_receiver=True)
        if self._error is not None:
            if self._pump is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await self._pump
            raise self._error

    def _frames(self, lo: int, hi: int) -> Iterator[tuple[Header, SendSpan]]:
        assert self.src_ids is not None  # push() checked
        layout = self.blocks.layout
        max_bytes = min(c.max_frame_bytes for c in self.stripes)
        n = len(self.dst_ids)
        per_layer = layout.payload_bytes(1, n)
        if len(self.stripes) > 1:  # at least a frame per stripe (whole blocks)
            share = -(-per_layer * (hi - lo) // len(self.stripes))
            max_bytes = max(layout.payload_bytes(1, 1), min(max_bytes, share))
        layer_step = max(1, max_bytes // per_layer)
        block_step = n if per_layer <= max_bytes else max_bytes // layout.payload_bytes(1, 1)
        for a in range(lo, hi, layer_step):
            b = min(hi, a + layer_step)
            for i in range(0, n, block_step):
                j = min(n, i + block_step)
                dst = self.dst_ids[i:j]
                header: Header = {
                    "kind": Kind.KV, "transfer": self.transfer_id, "layers": [a, b],
                    "blocks": dst, "dtype": layout.kv_dtype,
                    "shape": layout.payload_shape(b - a, j - i),
                    "nbytes": layout.payload_bytes(b - a, j - i)}
                yield header, SendSpan(self.blocks, a, b, self.src_ids[i:j])

    async def _send_frames(self, conn: OutboundConnection,
                           frames: Iterable[tuple[Header, SendSpan]]) -> None:
        """Send ``frames`` in order on ``conn`` until done or the transfer fails."""
        for header, span in frames:
            if self._error is not None:
                return
            await self._bounded(conn.send(header, span))
            self.last_sent = time.monotonic()

    async def _send_striped(self, frames: list[tuple[Header, SendSpan]]) -> None:
        """Frame i on stripe i mod n, the stripes at once; a stripe that fails fails the
        transfer, and the others stop at their next frame (all have stopped on return)."""
        async def one(conn: OutboundConnection, share: list[tuple[Header, SendSpan]]) -> None:
            try:
                await self._send_frames(conn, share)
            except TransferFailed as exc:
                self._on_failed(exc, tell_receiver=True)

        k = len(self.stripes)
        await asyncio.gather(*(one(c, frames[i::k]) for i, c in enumerate(self.stripes)))

    async def _run_pump(self) -> None:
        try:
            while self._queue and self._error is None:
                lo, hi = self._queue[0]
                if len(self.stripes) == 1:
                    await self._send_frames(self.conn, self._frames(lo, hi))
                else:
                    await self._send_striped(list(self._frames(lo, hi)))
                if self._error is not None:
                    return
                if self._queue:
                    self._queue.popleft()
        except TransferFailed as exc:
            self._on_failed(exc, tell_receiver=True)
        except Exception as exc:  # a bug: fail this transfer loudly, keep the process up
            log.exception("pump of transfer %r failed", self.transfer_id)
            self._on_failed(TransferFailed(self.transfer_id, f"internal error: {exc!r}"),
                            tell_receiver=True)
        finally:
            self._idle.set()
            self._unregister()

    # -- ending -------------------------------------------------------------------------------

    async def commit(self, first_token: int, logprob: float,
                     forked: Sequence[tuple[int, float]] = ()) -> None:
        """Send COMMIT after every queued layer and wait for the receiver's ACK. ``forked``:
        the first tokens (with logprobs) of sequences 1..n-1 of a forked request, whose n
        sequences share the pushed KV (the frame then lists all n)."""
        await self.flush()
        if self._committed:
            return
        loop = asyncio.get_running_loop()
        self._ack = loop.create_future()
        self._ending = True
        frame = {"kind": Kind.COMMIT, "transfer": self.transfer_id,
                 "token": int(first_token), "logprob": float(logprob)}
        if forked:
            frame["tokens"] = [int(first_token)] + [int(t) for t, _ in forked]
            frame["logprobs"] = [float(logprob)] + [float(lp) for _, lp in forked]
        try:
            await self._bounded(self.conn.send(frame))
            await self._bounded(asyncio.shield(self._ack))
        except TransferFailed as exc:
            self._on_failed(exc, tell_receiver=True)
        if self._error is not None:
            raise self._error
        self._committed = True
        self._unregister()

    async def finish_part(self) -> None:
        """End one part of a re-sharded push that another part commits (tandem/kv_transfer/
        reshard.py): every queued layer goes on the wire, then the transfer is over here; the
        COMMIT, on the committing part's connection, waits at the receiver until these
        frames have landed. Raises the transfer's error if it failed."""
        await self.flush()
        if self.done:
            return
        self._ending = True
        self._committed = True
        self._unregister()

    async def abort(self, reason: str = "aborted by the sender") -> None:
        """End the transfer: the frame on the wire finishes, the rest is dropped, ABORT is sent."""
        if self.done:
            return
        self._ending = True
        self._on_failed(TransferAborted(self.transfer_id, reason, by="sender"))
        if self._pump is not None and not self._pump.done():
            grace = max(0.0, self.deadline - time.monotonic()) + ABORT_GRACE_S
            try:
                await asyncio.wait_for(asyncio.shield(self._pump), grace)
            except asyncio.TimeoutError:
                self._pump.cancel()  # mid-frame: the connection is closed with it
                with contextlib.suppress(asyncio.CancelledError):
                    await self._pump
        if not self.conn.closed:
            with contextlib.suppress(ChannelClosed):
                await self.conn.send(abort(self.transfer_id, reason))
