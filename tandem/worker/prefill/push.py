"""One request's layer-wise KV push into a decode worker's reservation.

    accepted:      pusher task: open (BEGIN) at once, before anything is computed: the decode
                   worker's reservation is bound, and the connection's KEEPALIVEs renew its
                   lease while the request waits in the engine's queue (up to the deadline)
    engine thread: layer hook fires as layer l's KV lands (the step that completes the prefill;
                   earlier chunks are already in the cache, so every block is pushed but
                   those a sliding window left behind, which the reservation skips too)
        --AsyncEngine.deliver--> on_layer(l, src block ids, ready)
    event loop:    pusher task: (sources named on the first layer) ready.wait() on a pool
                   thread while the device still writes the layer -> push(l)
                   (layer l ships while the engine computes layer l + 1; never blocks the engine)
    commit(token): every layer queued -> COMMIT -> ACK                 -> nothing held here
    abort(reason): the pusher stops after its current item, ABORT      -> nothing held here

Between tensor-parallel groups (a ``PushPlan`` with routes, tandem/worker/prefill/routing.py)
rank 0 opens and pushes its own routes layer by layer the same way; at commit it has every
other rank push its routes from its own cache (tandem/worker/tp_group.py), finishes or
commits its routes into decode ranks 1.., waits for the other ranks, and commits decode
rank 0 last: when decode rank 0 commits, every decode rank holds its heads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import grpc

from tandem.engine.core.kv_cache_manager import FREED
from tandem.engine.kv_connector import LayerReady
from tandem.engine.outputs import TokenLogprob
from tandem.kv_transfer import KvTransferError, OutgoingTransfer, Sender
from tandem.kv_transfer.reshard import Route
from tandem.worker.prefill.errors import PushFailed, push_failed
from tandem.worker.prefill.routing import PushPlan
from tandem.worker.tp_group import GroupAgents

log = logging.getLogger(__name__)

# (layer, source block ids, the engine's handle saying whether the layer is written yet)
LayerItem = tuple[int, list[int], LayerReady]


def source_blocks(block_ids: Sequence[int], skip: int, count: int) -> list[int]:
    """The ``count`` blocks after the ``skip`` leading ones of a request's ``block_ids`` (the
    engine may hold more blocks than the prompt fills; never fewer). PushFailed when one of
    them was freed behind a sliding window: a reservation that skips fewer blocks than this
    engine freed (the decode worker must skip at least every block before the first decoded
    token's window, and this engine frees no more)."""
    src = list(block_ids[skip : skip + count])
    if FREED in src:
        raise PushFailed(f"the reservation starts at block {skip}, but this engine freed "
                         f"block {skip + src.index(FREED)} behind the sliding window",
                         grpc.StatusCode.FAILED_PRECONDITION)
    return src


class LayerPush:
    """Pushes one request's KV layer by layer as prefill computes it (see module docstring)."""

    def __init__(
        self, sender: Sender, transfer_id: str, plan: PushPlan, dst_block_ids: Sequence[int],
        deadline: float, skip_blocks: int = 0, agents: GroupAgents | None = None,
        adapter: str = "",
    ) -> None:
        """``skip_blocks``: the request's leading blocks the destination already holds; the
        push sends the blocks after them into ``dst_block_ids``. ``agents``: the other ranks
        of this worker's group, which push their routes of ``plan`` at commit. ``adapter``:
        the LoRA adapter identity the KV is computed under (BEGIN carries it)."""
        self.transfer_id = transfer_id
        self.transfer: OutgoingTransfer | None = None  # the first opened (a push has begun)
        self.layers_pushed = 0
        self._sender = sender
        self._plan = plan
        self._agents = agents
        self._routes: list[Route | None] = [None] if plan.plain else plan.of_rank(0)
        self._transfers: list[tuple[Route | None, OutgoingTransfer]] = []
        self._src: list[int] = []
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
        plan = self._plan
        for route in self._routes:
            t = await self._sender.open(
                self.transfer_id, plan.endpoints[0 if route is None else route.dst], None,
                self._dst, self._deadline, self._adapter, route=route,
                parts=1 if route is None else plan.parts[route.dst])
            self._transfers.append((route, t))
            self.transfer = self.transfer or t
        while not self._stopping and (item := await self._queue.get()) is not None:
            layer, src, ready = item
            if not self.layers_pushed:
                self._first_layer_at = time.monotonic()
                self._src = source_blocks(src, self._skip, len(self._dst))
                for _, t in self._transfers:
                    t.set_source(self._src)
            if ready.pending:  # the device still runs the layer's kernels
                await loop.run_in_executor(None, ready.wait)
            for _, t in self._transfers:
                t.push(layer, layer + 1)
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
            if self._plan.plain:
                await self.transfer.commit(*sent[0], forked=sent[1:])
            else:
                await self._commit_routes(sent)
        except KvTransferError as exc:
            raise push_failed(exc) from exc
        return time.monotonic() - self._first_layer_at

    async def _commit_routes(self, sent: list[tuple[int, float]]) -> None:
        """The other ranks push theirs; this rank finishes or commits its routes into decode
        ranks 1.., then, once every rank has answered, commits decode rank 0."""
        plan, others = self._plan, None
        if self._agents is not None:
            frames = {rank: {**plan.frame(rank), "src": self._src, "dst": self._dst,
                             "timeout_s": max(0.0, self._deadline - time.monotonic()),
                             "first": list(sent[0]), "forked": [list(f) for f in sent[1:]],
                             "adapter": self._adapter}
                      for rank in range(1, self._agents.world) if plan.of_rank(rank)}
            others = asyncio.ensure_future(self._agents.push(
                self.transfer_id, frames, max(0.1, self._deadline - time.monotonic())))
        last = None
        try:
            for route, t in self._transfers:
                assert route is not None
                if plan.committers[route.dst] != 0:
                    await t.finish_part()
                elif route.dst != 0:
                    await t.commit(*sent[0], forked=sent[1:])
                else:
                    last = t
        finally:
            errors = await others if others is not None else []
        if errors:
            raise PushFailed("a tensor-parallel rank's push failed: " + "; ".join(errors),
                             grpc.StatusCode.UNAVAILABLE, receiver=True)
        assert last is not None  # decode rank 0 holds head 0, as this rank does
        await last.commit(*sent[0], forked=sent[1:])

    async def abort(self, reason: str) -> None:
        """Stop pushing and tell the receiver; nothing is held for the transfer afterwards."""
        self._stopping = True
        self._queue.put_nowait(None)
        try:
            await asyncio.shield(self._task)  # bounded: every wait inside has the deadline
        except Exception as exc:  # the failure being cleaned up after, or one it caused
            log.info("push %s ended with %r while aborting", self.transfer_id, exc)
        if self._agents is not None and not self._plan.plain:
            self._agents.abort(self.transfer_id)
        for _, t in self._transfers:
            if not t.done:
                await t.abort(reason)

