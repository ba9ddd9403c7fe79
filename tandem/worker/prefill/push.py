"""One request's layer-wise KV push into a decode worker's reservation.

    accepted:      pusher task: open (BEGIN) at once, before anything is computed: the decode
                   worker's reservation is bound, and the connection's KEEPALIVEs renew its
                   lease while the request waits in the engine's queue (up to the deadline)
    engine thread: layer hook fires as layer l's KV lands (the step that completes the prefill;
                   earlier chunks are already in the cache, so every block is pushed)
        --call_soon_threadsafe--> on_layer(l, src block ids, ready)
    event loop:    pusher task: (sources named on the first layer) ready.wait() on a pool
                   thread while the device still writes the layer -> push(l)
                   (layer l ships while the engine computes layer l + 1; never blocks the engine)
    commit(token): every layer queued -> COMMIT -> ACK                 -> nothing held here
    abort(reason): the pusher stops after its current item, ABORT      -> nothing held here
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import grpc

from tandem.engine.kv_connector import LayerReady
from tandem.engine.outputs import TokenLogprob
from tandem.kv_transfer import Endpoint, KvTransferError, OutgoingTransfer, Sender
from tandem.worker.prefill.errors import PushFailed, push_failed

log = logging.getLogger(__name__)

# (layer, source block ids, the engine's handle saying whether the layer is written yet)
LayerItem = tuple[int, list[int], LayerReady]


class LayerPush:
    """Pushes one request's KV layer by layer as prefill computes it (see module docstring)."""

    def __init__(
        self, sender: Sender, transfer_id: str, endpoint: Endpoint, dst_block_ids: Sequence[int],
        deadline: float, skip_blocks: int = 0, adapter: str = "",
    ) -> None:
        """``skip_blocks``: the request's leading blocks the destination already holds; the
        push sends the blocks after them into ``dst_block_ids``. ``adapter``: the LoRA
        adapter identity the KV is computed under (BEGIN carries it)."""
        self.transfer_id = transfer_id
        self.transfer: OutgoingTransfer | None = None
        self.layers_pushed = 0
        self._sender = sender
        self._endpoint = endpoint
        self._dst = list(dst_block_ids)
        self._deadline = deadline
        self._skip = skip_blocks
        self._adapter = adapter
        self._first_layer_at = 0.0
        self._stopping = False
        self._queue: asyncio.Queue[LayerItem | None] = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def on_layer(self, layer: int, src_block_ids: list[int], ready: LayerReady) -> None:
        """Queue one computed layer (called on the event loop)."""
        self._queue.put_nowait((layer, src_block_ids, ready))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        if self._stopping:
            return
        self.transfer = await self._sender.open(
            self.transfer_id, self._endpoint, None, self._dst, self._deadline, self._adapter)
        while not self._stopping and (item := await self._queue.get()) is not None:
            layer, src, ready = item
            if not self.layers_pushed:
                self._first_layer_at = time.monotonic()
                # The prefill engine may hold more blocks than the prompt fills; never fewer.
                self.transfer.set_source(src[self._skip : self._skip + len(self._dst)])
            if ready.pending:  # the device still runs the layer's kernels
                await loop.run_in_executor(None, ready.wait)
            self.transfer.push(layer, layer + 1)
            self.layers_pushed += 1

    async def commit(self, firsts: Sequence[tuple[int, TokenLogprob | None]], num_layers: int
                     ) -> float:
        """Finish the push and COMMIT the first token (a forked request's: every sequence's,
        in order; a missing logprob is sent as 0); returns the seconds from the first layer
        to the COMMIT's ACK (the push, not the queueing before it). Raises PushFailed or
        LayoutMismatch (a kv_transfer error, mapped by ``push_failed``)."""
        sent = [(t, lp.logprob if lp is not None else 0.0) for t, lp in firsts]
        self._queue.put_nowait(None)
        try:
            await asyncio.shield(self._task)  # a cancelled caller must not cancel an open mid-way
            if self.transfer is None or self.layers_pushed != num_layers:
                raise PushFailed(
                    f"KV of {self.layers_pushed} of {num_layers} layers was computed",
                    grpc.StatusCode.ABORTED,
                )
            await self.transfer.commit(*sent[0], forked=sent[1:])
        except KvTransferError as exc:
            raise push_failed(exc) from exc
        return time.monotonic() - self._first_layer_at

    async def abort(self, reason: str) -> None:
        """Stop pushing and tell the receiver; nothing is held for the transfer afterwards."""
        self._stopping = True
        self._queue.put_nowait(None)
        try:
            await asyncio.shield(self._task)  # bounded: every wait inside has the deadline
        except Exception as exc:  # the failure being cleaned up after, or one it caused
            log.info("push %s ended with %r while aborting", self.transfer_id, exc)
        if self.transfer is not None and not self.transfer.done:
            await self.transfer.abort(reason)

