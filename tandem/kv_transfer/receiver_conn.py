"""One accepted connection on the receiver: handshake, then frames into reserved blocks.

    HELLO x3/ACK (in the pre-authentication pool; a member slot once proven)
    -> loop: BEGIN | KV (+payload) | KEEPALIVE | COMMIT | ABORT, every frame's MAC checked
       before it is acted on (transport/byte_channel.py)
    protocol error (a bad MAC included), timeout or EOF -> NACK (if possible), close, abort
    the transfers bound here (their blocks go back to the decode worker)

Nothing from the wire is used before it is checked against the layout and the reservation
(docs/kv_transfer.md section 4); a bad peer loses its connection, never the receiver.

The fence: a KV frame's bytes go into the cache only while its reservation is alive, and the
channel checks that after the bytes have arrived, right before each write, with no await in
between (``Channel.recv_payload``); ``release`` and expiry run on this same event loop, so once
they return nothing more is written into the blocks. Frames that lose the race are read into
scratch and dropped; the stream stays in sync.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from tandem.kv_transfer.blocks import RecvSpan
from tandem.kv_transfer.errors import (
    ChannelClosed,
    HandshakeError,
    MalformedFrame,
    PayloadChecksumError,
    ProtocolError,
    TransferRejected,
)
from tandem.kv_transfer.frames import Header, Kind, ack, nack
from tandem.kv_transfer.handshake import server_handshake
from tandem.kv_transfer.transport.base import Channel

if TYPE_CHECKING:
    from tandem.kv_transfer.receiver import Receiver

log = logging.getLogger(__name__)


def _never() -> bool:
    return False


class InboundConnection:
    """Serves one sender connection for a ``Receiver``."""

    def __init__(self, rx: Receiver, conn_id: int, channel: Channel) -> None:
        self.rx = rx
        self.id = conn_id
        self.ch = channel
        self._span: RecvSpan | None = None
        self.blocks = rx.blocks  # the cache, or the head window a route connection fills
        self.layout = rx.layout
        self.receiving = False  # in the middle of a KV payload (stats; tests gate on it)
        self._done = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._close_reason: str | None = None
        self._watchdog: asyncio.TimerHandle | None = None

    @property
    def buffered_bytes(self) -> int:
        """Segment or staging memory this connection holds."""
        return self.ch.buffered_bytes + (self._span.buffered_bytes if self._span else 0)

    async def finished(self) -> None:
        """Wait until ``run`` has cleaned up."""
        await self._done.wait()

    def close(self, reason: str) -> None:
        """Close the channel; ``run`` notices, aborts this connection's transfers and returns."""
        if self._close_reason is None:
            self._close_reason = reason
        self.ch.close()

    def send_soon(self, header: Header) -> None:
        """Send a frame from outside the frame loop (ABORT on release or expiry)."""
        async def _send() -> None:
            with contextlib.suppress(ChannelClosed):
                await self.ch.send(header)

        task = asyncio.get_running_loop().create_task(_send())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _arm(self, seconds: float, what: str) -> None:
        """Close the connection if the next step takes longer than ``seconds``."""
        self._disarm()
        self._watchdog = asyncio.get_running_loop().call_later(seconds, self.close, what)

    def _disarm(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    async def run(self) -> None:
        """Handshake, then serve frames until the connection ends; never raises (but cancel)."""
        rx, ch = self.rx, self.ch
        cfg = rx.config
        reason = "connection ended"
        try:
            self._arm(cfg.handshake_timeout_s, "handshake timeout")
            window = await server_handshake(ch, rx.layout, cfg.secret, cfg.keepalive_s,
                                            lambda: rx._admit(self), cfg.codecs,
                                            cfg.max_stripes, rx.group, rx.rank)
            if window is not None:  # one route of a re-sharded push: its heads only
                self.blocks = rx.blocks.window(*window)
                self.layout = self.blocks.layout
            while True:
                self._arm(cfg.idle_timeout_s, "idle timeout")
                header = await ch.recv()
                self._disarm()
                kind = header["kind"]
                if kind == Kind.KV:
                    await self._on_kv(header)
                elif kind == Kind.BEGIN:
                    await self._on_begin(header)
                elif kind == Kind.KEEPALIVE:
                    self._on_keepalive(header)
                elif kind == Kind.COMMIT:
                    await self._on_commit(header)
                elif kind == Kind.ABORT:
                    self._on_abort(header)
                else:
                    raise MalformedFrame(f"{Kind(kind).name} is not a sender frame")
        except ChannelClosed as exc:
            reason = self._close_reason or f"connection closed: {exc}"
            log.info("%s %s: %s", ch.transport, ch.peer, reason)
        except (HandshakeError, ProtocolError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
            rx.refusals[exc.code] += 1
            log.warning("closing %s connection from %s: %s", ch.transport, ch.peer, reason)
            if not isinstance(exc, HandshakeError):  # the handshake has sent its own NACK
                with contextlib.suppress(ChannelClosed):
                    await asyncio.wait_for(ch.send(nack(0, exc.code, reason)), 1.0)
        except asyncio.TimeoutError:
            reason = "timed out sending a NACK"
        except asyncio.CancelledError:
            reason = "receiver closing"
            raise
        except Exception as exc:  # a bug: log it loudly, drop only this connection
            reason = f"internal error: {exc!r}"
            log.exception("receiver connection %s failed", ch.peer)
        finally:
            self._disarm()
            for res in rx.table.bound_to(self.id):
                rx._end(res.transfer_id, "aborted", code="connection_lost",
                        reason=reason, by="network")
            ch.close()
            for task in list(self._tasks):
                task.cancel()
            self._done.set()

    async def _nack(self, ref: Kind, code: str, reason: str, transfer: str) -> None:
        await self.ch.send(nack(ref, code, reason, transfer))

    async def _on_begin(self, header: Header) -> None:
        rx, tid = self.rx, header["transfer"]
        if rx.table.bound >= rx.config.max_active_transfers:
            await self._nack(Kind.BEGIN, "busy", "receiver at max_active_transfers", tid)
            return
        cfg = rx.config
        ttl_ms = header.get("ttl_ms")
        ttl = cfg.max_transfer_s if ttl_ms is None else min(ttl_ms / 1000, cfg.max_transfer_s)
        stripes, parts = header.get("stripes", 1), header.get("parts", 1)
        if not 1 <= stripes <= cfg.max_stripes:
            raise MalformedFrame(f"BEGIN.stripes {stripes} outside 1..{cfg.max_stripes}")
        if not 1 <= parts <= rx.table.num_heads:
            raise MalformedFrame(f"BEGIN.parts {parts} outside 1..{rx.table.num_heads}")
        heads = self.blocks.heads  # a route's window, None for the whole cache
        try:
            res = rx.table.bind(tid, self.id, header["blocks"], now=time.monotonic(),
                                window=cfg.progress_timeout_s, ttl=ttl, stripes=stripes,
                                parts=parts, heads=heads, adapter=header.get("adapter", ""))
        except TransferRejected as exc:
            await self._nack(Kind.BEGIN, exc.code, exc.reason, tid)
            return
        rx._arm(res)  # a short ttl can end the lease sooner than the armed timer
        rx._touch()

    def _on_keepalive(self, header: Header) -> None:
        """Renew a transfer bound to this connection; anything else is ignored (a transfer that
        ended here was already reported to its sender by NACK or ABORT)."""
        rx = self.rx
        res = rx.table.get(header["transfer"])
        if res is not None and self.id in res.conns:
            rx._renew(res)
            rx.keepalives += 1
            rx._touch()

    def _check_kv(self, header: Header) -> tuple[int, int, list[int]]:
        """Layer range and ids of a KV frame, after checking every field against the layout."""
        layout = self.layout
        layers, ids = header["layers"], header["blocks"]
        if len(layers) != 2:
            raise MalformedFrame("KV.layers must be [lo, hi]")
        lo, hi = layers
        if header["dtype"] != layout.kv_dtype:
            raise MalformedFrame(f"KV dtype {header['dtype']!r} != {layout.kv_dtype!r}")
        if not 0 <= lo < hi <= layout.num_layers:
            raise MalformedFrame(f"KV layers [{lo}, {hi}) outside 0..{layout.num_layers}")
        if header["shape"] != layout.payload_shape(hi - lo, len(ids)):
            raise MalformedFrame(f"KV shape {header['shape']} does not match its layers/blocks")
        if header["nbytes"] != layout.payload_bytes(hi - lo, len(ids)):
            raise MalformedFrame(f"KV nbytes {header['nbytes']} does not match its shape")
        if header["nbytes"] > self.ch.max_payload:
            raise MalformedFrame(f"KV payload {header['nbytes']} over {self.ch.max_payload}")
        return lo, hi, ids

    async def _on_kv(self, header: Header) -> None:
        rx, tid = self.rx, header["transfer"]
        lo, hi, ids = self._check_kv(header)
        res = rx.table.get(tid)
        self._arm(rx.config.frame_timeout_s, "frame timeout")
        if res is None or self.id not in res.conns:  # late or unbegun: skip the payload, stay up
            await self.ch.recv_payload(header, None, _never)
            self._disarm()
            await self._nack_late(tid)
            return
        rx.table.check_frame(res, lo, hi, ids)
        rx._renew(res)
        if not res.first_kv_at:
            res.first_kv_at = time.monotonic()
        self._span = RecvSpan(self.blocks, lo, hi, ids)
        self.receiving = True
        rx._touch()
        try:
            # res.alive is checked by the channel after the bytes arrive, before each write.
            landed = await self.ch.recv_payload(header, self._span, res.alive)
        except PayloadChecksumError as exc:
            rx._end(tid, "aborted", code="checksum", reason=str(exc), by="network")
            await self._nack(Kind.KV, "checksum", str(exc), tid)
            return
        finally:
            self._span = None
            self.receiving = False
            self._disarm()
        rx._touch()
        if landed:
            rx.table.mark(res, lo, hi, ids, self.id)
            rx.bytes_received += header["nbytes"]
            rx._renew(res)
            if res.complete:
                rx._landed(res)
        else:  # fenced: the reservation ended while the bytes were arriving
            await self._nack_late(tid)

    async def _nack_late(self, tid: str) -> None:
        """NACK a KV frame whose transfer is not (or no longer) bound here; it wrote nothing."""
        why = self.rx.table.ended_reason(tid)
        code = "expired" if why == "expired" else "unknown_transfer"
        await self._nack(Kind.KV, code, f"no transfer bound here ({why or 'unknown'})", tid)

    async def _on_commit(self, header: Header) -> None:
        rx, tid = self.rx, header["transfer"]
        res = rx.table.get(tid)
        if res is not None and self.id in res.conns and not res.complete \
                and (len(res.conns) > 1 or res.parts > 1 or res.stripes > 1):
            # Striped or re-sharded: the other connections' last frames, or their very BEGIN
            # (each connection is read on its own), may still be on the way. Wait for them or
            # for the transfer's end (its lease bounds the wait).
            await rx.wait_landed(res)
            res = rx.table.get(tid)
        if res is None or self.id not in res.conns:
            why = rx.table.ended_reason(tid)
            code = "expired" if why == "expired" else "unknown_transfer"
            await self._nack(Kind.COMMIT, code, f"no transfer bound here ({why or 'unknown'})", tid)
            return
        if not res.complete:
            reason = f"{res.missing} (layer, block, head) triples never arrived"
            rx._end(tid, "aborted", code="incomplete", reason=reason, by="sender")
            await self._nack(Kind.COMMIT, "incomplete", reason, tid)
            return
        # a forked request's other first tokens (frames.py checked their count and shape)
        forked = (header.get("tokens", [])[1:], header.get("logprobs", [])[1:])
        rx._end(tid, "committed", code="", reason="", token=header["token"],
                logprob=header["logprob"], forked=forked)
        await self.ch.send(ack(Kind.COMMIT, tid))

    def _on_abort(self, header: Header) -> None:
        rx, tid = self.rx, header["transfer"]
        res = rx.table.get(tid)
        if res is not None and self.id in res.conns:
            rx._end(tid, "aborted", code="aborted", reason=header.get("reason", ""), by="sender")
