"""The prefill worker's logic: prefill a prompt, push its KV, commit the first token.

    Prefill ──> check layout, endpoint, blocks ──> engine.remote.prefill.add(max_tokens=1)
            ──> layer hook: LayerPush opens the transfer and ships each layer as it lands
                (the blocks after ``skip_tokens``: the decode worker caches the ones before)
            ──> first token sampled ──> COMMIT (ACK) ──> reply first token and timings
                (a forked request, ``n`` > 1: the prompt computed and pushed once, n first
                tokens sampled from its last row, sequence j with seed + j; one COMMIT)
                (meanwhile, between engine steps, remote.prefill.release: blocks back to the pool,
                still prefix-cached; the reply never waits for the engine's current step)
    any failure / Abort / caller gone ──> ABORT the transfer, abort the request: nothing held
    a push that failed at the decode worker (dead, drained, unreachable; or silent while the
        push waited on it) ──> UNAVAILABLE with the ``tandem-fault: receiver`` trailer
        (tandem/worker/prefill/errors.py): the router moves the leg, this worker is fine

Traced under the Prefill call's span (``PrefillSpec.trace``): ``prefill.engine`` (queued and
computed up to the first token), ``kv.push`` (BEGIN to the COMMIT's ACK, the layers shipped
meanwhile) and ``kv.commit`` below it (the last layers and COMMIT, after the first token).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass

import grpc

from tandem.common.obs import tracing
from tandem.common.wire import MAX_SEQUENCES
from tandem.engine.async_engine import AsyncEngine
from tandem.engine.core.request import sequence_id
from tandem.engine.kv_connector import LayerReady
from tandem.engine.outputs import EngineStats, RequestOutput
from tandem.engine.sampling_params import SamplingParams
from tandem.kv_transfer import Sender
from tandem.worker.commit_hold import CommitHold
from tandem.worker.errors import (
    AdapterMismatch,
    BadRequest,
    Draining,
    TransferEnded,
    WrongState,
)
from tandem.worker.first_token import FirstToken
from tandem.worker.layout import LayoutSummary
from tandem.worker.metrics import TransferTotals
from tandem.worker.prefill.errors import PushFailed
from tandem.worker.prefill.metrics import PrefillMetrics
from tandem.worker.prefill.push import LayerPush
from tandem.worker.prefill.routing import PushPlan, plan_push
from tandem.worker.tp_group import GroupAgents

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PrefillConfig:
    """Prefill-worker settings (the engine and the sender have their own)."""

    worker_id: str
    transfer_timeout_s: float = 30.0  # from Prefill arrival to the COMMIT's ACK


@dataclass(frozen=True, slots=True)
class PrefillSpec:
    """One Prefill call: the prompt, how to sample its first token, where its KV goes."""

    request_id: str
    token_ids: list[int]
    params: SamplingParams
    transfer_id: str
    block_ids: list[int]
    kv_endpoint: str
    layout: LayoutSummary  # the decode worker's: must be this worker's own
    prior_output_tokens: int = 0  # a migrated request's already-streamed tail of token_ids
    skip_tokens: int = 0  # the decode worker holds these leading tokens' KV: not pushed
    trace: tracing.Span = tracing.NO_SPAN  # the call's span, the parent of the prefill's own
    n: int = 1  # sequences of a forked request: n first tokens, one push
    lora_identity: str = ""  # the decode worker's identity of params.lora: must be ours

    def skip_blocks(self, block_size: int) -> int:
        """Leading blocks of the prompt that are not pushed."""
        return self.skip_tokens // block_size


class PrefillWorker:
    """Prefill-side handoff logic over an ``AsyncEngine`` and a ``Sender``."""

    def __init__(
        self,
        ae: AsyncEngine,
        sender: Sender,
        config: PrefillConfig,
        metrics: PrefillMetrics | None = None,
        hold: CommitHold | None = None,
        agents: GroupAgents | None = None,
    ) -> None:
        """``hold``: a test-only pause before each COMMIT (tandem/worker/commit_hold.py;
        None: never). ``agents``: ranks 1..N-1 of this worker's tensor-parallel group, each
        pushing its own KV heads (tandem/worker/tp_group.py)."""
        self.config = config
        self.metrics = metrics if metrics is not None else PrefillMetrics()
        self._hold = hold if hold is not None else CommitHold()
        self.leased_blocks = 0  # destination blocks of the pushes in flight
        engine = ae.engine
        self.layout = sender.layout
        assert sender.group is not None
        self.group = sender.group
        # what a push moves, for the metrics: every head of the prompt (all ranks' together)
        self._whole = sender.group.whole() if sender.group.world > 1 else sender.layout
        self._agents = agents
        self._vocab_size = engine.arch.vocab_size
        self._ae = ae
        self._sender = sender
        self._pushes: dict[str, LayerPush] = {}
        self._tasks: dict[str, asyncio.Task[FirstToken]] = {}
        self._releasing: dict[str, asyncio.Task[None]] = {}  # committed, blocks being freed
        self._aborted: set[str] = set()
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.draining = False

    @property
    def engine(self) -> AsyncEngine:
        """The engine this worker serves (its LoraAdapters service runs over it too)."""
        return self._ae

    async def start(self) -> None:
        """Install the layer hook on the engine."""
        self._loop = asyncio.get_running_loop()
        await self._ae.call(lambda e: e.remote.prefill.set_layer_hook(self._hook))

    def _hook(self, layer: int, done: list[tuple[str, list[int]]], ready: LayerReady) -> None:
        """Engine thread: layer ``layer`` of ``done``'s requests is being written into the
        cache (``ready``: the engine's handle the pusher waits on before reading it)."""
        assert self._loop is not None  # in order with the step's outputs, keeping the GIL
        self._ae.deliver(self._loop, self._on_layer, layer, done, ready)

    def _on_layer(self, layer: int, done: list[tuple[str, list[int]]], ready: LayerReady
                  ) -> None:
        for request_id, block_ids in done:
            push = self._pushes.get(request_id)
            if push is not None:  # None: aborted in the meantime
                push.on_layer(layer, block_ids, ready)

    # -- RPCs ------------------------------------------------------------------------------
    async def prefill(self, spec: PrefillSpec, deadline_s: float | None = None) -> FirstToken:
        """Prefill, push and commit; see the module docstring. ``deadline_s`` (seconds from
        now) caps the transfer timeout. Raises Draining, LayoutMismatch, BadRequest,
        InvalidRequestError, TransferEnded (aborted) or a push error."""
        if self.draining:
            raise Draining()
        rid = spec.request_id
        if not rid or len(rid) > 256:
            raise BadRequest("request_id", "must be 1..256 characters")
        if rid in self._tasks or rid in self._releasing:
            raise BadRequest("request_id", f"{rid!r} is already in use")
        plan = self._check(spec)
        task = asyncio.get_running_loop().create_task(self._prefill(spec, plan, deadline_s))
        self._tasks[rid] = task
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if rid in self._aborted and current is not None and not current.cancelling():
                raise TransferEnded(f"request {rid!r} aborted") from None
            raise
        finally:
            self._tasks.pop(rid, None)
            self._aborted.discard(rid)
            self._touch()

    def _check(self, spec: PrefillSpec) -> PushPlan:
        plan = plan_push(self.group, spec.kv_endpoint, spec.layout)  # or LayoutMismatch
        if not spec.transfer_id:
            raise BadRequest("transfer_id", "must not be empty")
        if not 1 <= spec.n <= MAX_SEQUENCES:
            raise BadRequest("n", f"{spec.n} sequences, not 1..{MAX_SEQUENCES}")
        bs = self.layout.block_size
        if spec.skip_tokens % bs or not 0 <= spec.skip_tokens < len(spec.token_ids):
            raise BadRequest("skip_tokens", f"{spec.skip_tokens} is not a multiple of the block "
                             f"size {bs} below the prompt's {len(spec.token_ids)} tokens")
        need = -(-len(spec.token_ids) // bs) - spec.skip_blocks(bs)
        if len(spec.block_ids) != need:
            raise BadRequest("block_ids", f"{len(spec.block_ids)} destination blocks for a "
                             f"prompt of {len(spec.token_ids)} tokens (the first "
                             f"{spec.skip_tokens} already there) that needs {need}")
        spec.params.validate(self._vocab_size)
        ours = self._ae.engine.lora_identity(spec.params.lora)  # unknown: InvalidRequestError
        if ours != spec.lora_identity:
            raise AdapterMismatch(f"adapter {spec.params.lora or '(base model)'!r} is "
                                  f"{ours or '(base model)'!r} here, "
                                  f"{spec.lora_identity or '(base model)'!r} on the decode worker")
        return plan

    async def _prefill(self, spec: PrefillSpec, plan: PushPlan,
                       deadline_s: float | None) -> FirstToken:
        t0 = time.monotonic()
        timeout = self.config.transfer_timeout_s
        if deadline_s is not None:
            timeout = min(timeout, deadline_s)
        # One token only (after any a migrated request already has): min_tokens still keeps EOS
        # out of it.
        n_out = spec.prior_output_tokens + 1
        first = dataclasses.replace(spec.params, max_tokens=n_out,
                                    min_tokens=min(spec.params.min_tokens, n_out))
        push_span = tracing.start_span("kv.push", spec.trace, attributes={
            "tandem.transfer_id": spec.transfer_id, "tandem.blocks": len(spec.block_ids)})
        with tracing.ended(push_span):
            return await self._prefill_and_push(spec, first, plan, t0, timeout,
                                                deadline_s, push_span)

    async def _prefill_and_push(self, spec: PrefillSpec, first: SamplingParams,
                                plan: PushPlan, t0: float, timeout: float,
                                deadline_s: float | None, push_span: tracing.Span
                                ) -> FirstToken:
        rid = spec.request_id
        push = LayerPush(self._sender, spec.transfer_id, plan, spec.block_ids, t0 + timeout,
                         spec.skip_blocks(self.layout.block_size), self._agents,
                         spec.lora_identity)
        self._pushes[rid] = push
        self.leased_blocks += len(spec.block_ids)
        committed = False
        seqs = [sequence_id(rid, j) for j in range(spec.n)]
        try:
            tokens, prior, n = spec.token_ids, spec.prior_output_tokens, spec.n
            with tracing.span("prefill.engine", spec.trace,
                              attributes={"tandem.prompt_tokens": len(tokens)}) as engine_span:
                await self._ae.prepare(first)
                await self._ae.call(
                    lambda e: e.remote.prefill.add(tokens, first, request_id=rid,
                                                   prior_output_tokens=prior, n=n,
                                                   push_skip_tokens=spec.skip_tokens),
                    stream=seqs,
                )
                outs = [await self._first_output(sid) for sid in seqs]
                out = outs[0]
                engine_span.set_attribute("tandem.cached_tokens", out.num_cached_tokens)
            prefill_s = time.monotonic() - t0
            if any(not o.new_token_ids for o in outs):
                raise WrongState(f"prefill produced no token ({out.finish_reason})")
            self.metrics.first_token(prefill_s)
            answer = FirstToken.of(outs, prefill_s)
            firsts = [(answer.token_id, answer.logprob), *answer.forked]
            await self._hold.before_commit(rid)
            try:
                with tracing.span("kv.commit", push_span):
                    transfer_s = await push.commit(firsts, self.layout.num_layers)
            except PushFailed as exc:
                raise _out_of_time(exc, t0, timeout, prefill_s, deadline_s is not None
                                   and deadline_s <= self.config.transfer_timeout_s) from exc
            committed = True
            self.metrics.transfer_committed(self._pushed_bytes(push, spec), transfer_s)
            return dataclasses.replace(answer, transfer_s=transfer_s)
        finally:
            self._pushes.pop(rid, None)
            push_span.set_attributes({"tandem.layers_pushed": push.layers_pushed,
                                      "tandem.bytes": self._pushed_bytes(push, spec)})
            try:
                if not committed:
                    await push.abort("prefill failed or was aborted")
            finally:
                self.leased_blocks -= len(spec.block_ids)
                if push.transfer is not None:  # opened: it counts as a push
                    self.metrics.push_ended(self._pushed_bytes(push, spec), committed)
            if committed:
                # The reply goes now: the engine frees the held blocks (into the prefix
                # cache) between steps, and its current step may be a long prefill of the
                # next prompt, which the router's first token must not wait for.
                self._release_later(rid)
            elif self._ae.alive:  # aborts the request (every sequence), freeing its blocks
                await self._ae.call(lambda e: [e.abort(sid) for sid in seqs])
            for sid in seqs:
                self._ae.close_stream(sid)

    def _release_later(self, request_id: str) -> None:
        """Free a committed request's held blocks on the engine without waiting for it; the
        task is tracked (``busy``, ``close``) so the blocks are freed on every path."""
        async def release() -> None:
            try:
                if self._ae.alive:
                    await self._ae.call(lambda e: e.remote.prefill.release(request_id))
            except Exception:  # the engine died meanwhile: its blocks die with it
                log.exception("releasing %s's held blocks failed", request_id)
            finally:
                self._releasing.pop(request_id, None)
                self._touch()

        self._releasing[request_id] = asyncio.get_running_loop().create_task(release())

    def _pushed_bytes(self, push: LayerPush, spec: PrefillSpec) -> int:
        return self._whole.payload_bytes(push.layers_pushed, len(spec.block_ids))

    async def _first_output(self, request_id: str) -> RequestOutput:
        async for out in self._ae.outputs(request_id):
            return out
        raise WrongState(f"request {request_id!r} produced no output")

    async def abort(self, request_id: str) -> bool:
        """Abort a prefill in progress (its caller gets ABORTED); False when unknown."""
        task = self._tasks.get(request_id)
        if task is None or task.done():
            return False
        self._aborted.add(request_id)
        task.cancel()
        return True

    async def stats(self) -> EngineStats:
        """The engine's counters right now (as of its current step's start while one runs:
        AsyncEngine.stats)."""
        return await self._ae.stats()

    def transfer_totals(self) -> TransferTotals:
        """KV pushed, pushes that failed, destination blocks being pushed right now."""
        m = self.metrics
        return TransferTotals(m.bytes_pushed, m.failed_pushes, self.leased_blocks)

    # -- lifecycle ---------------------------------------------------------------------------
    def _touch(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    def busy(self) -> bool:
        """True while a prefill is in progress or a committed one's blocks are being freed."""
        return bool(self._tasks or self._releasing)

    def begin_drain(self) -> None:
        """Take no new prefills; those in progress finish."""
        self.draining = True

    async def wait_idle(self) -> None:
        """Return once no prefill is in progress."""
        while self.busy():
            await self._changed.wait()

    async def retire(self) -> None:
        """Abort what is left (held KV leases released), close the sender's connections and
        take the layer hook off; the engine goes on (a role flip, tandem/worker/dual/)."""
        for rid in list(self._tasks):
            await self.abort(rid)
        tasks = list(self._tasks.values())
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*self._releasing.values(), return_exceptions=True)
        await self._sender.close()
        if self._ae.alive:
            await self._ae.call(lambda e: e.remote.prefill.set_layer_hook(None))

    async def close(self) -> None:
        """``retire``, then stop the engine thread."""
        await self.retire()
        await self._ae.shutdown()


def _out_of_time(exc: PushFailed, t0: float, timeout: float, computed_s: float,
                 callers: bool) -> PushFailed:
    """A push that failed after its deadline (``t0 + timeout``) failed for lack of time,
    whatever the transfer layer reported (the receiver's lease ends at that deadline too, so
    which side noticed first is a race): DEADLINE_EXCEEDED when the caller's deadline was the
    bound; else, when the first token was computed (``computed_s`` after ``t0``) within the
    first half of the time, the push then waited on a receiver that stopped answering (a
    partition, a decode worker hung): its failure, not this worker's (UNAVAILABLE, receiver);
    else RESOURCE_EXHAUSTED (the prefill queued behind others for most of the transfer
    timeout: this worker is busy, not gone, and another one may do it)."""
    if time.monotonic() < t0 + timeout:
        return exc
    if callers:
        return PushFailed(f"{exc} (the request's deadline passed)",
                          grpc.StatusCode.DEADLINE_EXCEEDED)
    if computed_s <= timeout / 2:
        return PushFailed(f"{exc} (the decode worker stopped answering the push)",
                          grpc.StatusCode.UNAVAILABLE, receiver=True)
    return PushFailed(f"{exc} (the transfer timeout passed: this prefill worker is busy)",
                      grpc.StatusCode.RESOURCE_EXHAUSTED)
