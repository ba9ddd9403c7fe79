"""A live move of a decoding request from this decode worker to another (the sender's side).

    Suspend ──> engine.remote.migrate.suspend between two steps: out of the batch, blocks
                pinned; the request's engine stream ends with ``Suspended`` right after the
                outputs already delivered, so its Decode stream carries every token so far
                and then ends (ABORTED, ``tandem-fault: suspended``)
    MoveOut ──> the target reserved the request's tokens but the last: push the blocks it
                lacks (after its cached prefix) over the KV transfer layer, this worker the
                sender, then COMMIT the last token there ──> this worker frees the request
            ──> the push failed (target dead, unreachable, refused): the request resumes
                here, untouched (the router reads it on with a new Decode call)
    Resume  ──> back into the batch (the router found no target)

    PreCopy ──> before the Suspend, while the request decodes on: its leading full blocks
                (never written again) pinned in the engine, pushed into the target's pre-copy
                reservation and committed there (held, prefix-cached), then unpinned; the
                move's own reservation then finds them cached, and MoveOut pushes only the
                blocks written since (the partial last one, any filled meanwhile). A push that
                fails changes nothing here.

``LiveMoves`` holds the engine-side steps and the push; the RPCs over the worker's streams
(which stream is suspended, its lease, a resumed stream) are tandem/worker/decode/
stream_moves.py's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import grpc

from tandem.common.wire import RECEIVER_FAULT, SUSPENDED_FAULT
from tandem.engine.async_engine import AsyncEngine
from tandem.engine.core.kv_cache_manager import FREED
from tandem.engine.errors import InvalidRequestError, NotMovableError, UnknownRequestError
from tandem.engine.kv_connector import Pinned
from tandem.engine.kv_connector import Suspended as Continuation
from tandem.engine.llm_engine import LLMEngine
from tandem.kv_transfer import ConfigError, Endpoint, KvLayout, KvTransferError, Sender
from tandem.worker.commit_hold import CommitHold
from tandem.worker.errors import BadRequest, LayoutMismatch, WorkerError, WrongState
from tandem.worker.kv_endpoint import parse_endpoint
from tandem.worker.layout import LayoutSummary, layout_mismatch


class Suspended(WorkerError):
    """The request left the batch for a live move: its stream ends here (the router moves
    it, or resumes it and reads on)."""

    code = grpc.StatusCode.ABORTED
    fault = SUSPENDED_FAULT


class MoveFailed(WorkerError):
    """The push to the move's target failed; the request runs on here (the failure is the
    target's: ``tandem-fault: receiver``)."""

    code = grpc.StatusCode.UNAVAILABLE
    fault = RECEIVER_FAULT


@dataclass(frozen=True, slots=True)
class MoveTarget:
    """The target's reservation for the request's tokens but the last, and that token."""

    transfer_id: str
    block_ids: list[int]
    kv_endpoint: str
    layout: LayoutSummary
    skip_tokens: int  # the target's cached prefix: not pushed
    last_token: int


@dataclass(frozen=True, slots=True)
class PreCopyTarget:
    """The target's pre-copy reservation for the request's leading ``token_ids`` (whole
    blocks)."""

    transfer_id: str
    block_ids: list[int]
    kv_endpoint: str
    layout: LayoutSummary
    skip_tokens: int  # the target's cached prefix: not pushed
    token_ids: list[int]


@dataclass(frozen=True, slots=True)
class Departure:
    """A suspended request's continuation and the identity of the adapter its KV was
    computed under (what the push's BEGIN names), both taken in the suspend's engine call."""

    continuation: Continuation
    adapter: str


@dataclass(frozen=True, slots=True)
class Moved:
    """What a move pushed."""

    bytes: int
    seconds: float


class LiveMoves:
    """The engine's suspend/resume and the push of a move (see the module docstring)."""

    def __init__(self, ae: AsyncEngine, sender: Sender | None, layout: KvLayout,
                 transfer_timeout_s: float, hold: CommitHold | None = None) -> None:
        """``sender`` None: this worker cannot push KV (every Suspend is refused)."""
        self._ae = ae
        self._sender = sender
        self._layout = layout
        self._timeout_s = transfer_timeout_s
        self._hold = hold if hold is not None else CommitHold()

    async def suspend(self, request_id: str) -> Departure:
        """Take the request out of the batch; its engine stream then ends with Suspended.
        Raises WrongState when it cannot move (the reason says why) and runs on."""
        if self._sender is None:
            raise WrongState("this decode worker has no KV sender: its streams cannot move")

        def leave(e: LLMEngine) -> Departure:  # one engine call: none waits in the push
            moved = e.remote.migrate.suspend(request_id)
            return Departure(moved, e.lora_identity(moved.lora))

        try:
            departure = await self._ae.call(leave)
        except NotMovableError as exc:
            raise WrongState(str(exc)) from exc
        # Every output of the steps before is queued on the stream by now (the engine thread
        # delivers a step's outputs before a later call's reply): the end goes after them.
        self._ae.interrupt(request_id, Suspended(f"request {request_id!r} is moving"))
        return departure

    async def resume(self, request_id: str) -> bool:
        """Back into the batch, with a new engine stream (read it afresh)."""
        return await self._ae.call(lambda e: e.remote.migrate.resume(request_id),
                                   stream=request_id)

    async def precopy(self, request_id: str, target: PreCopyTarget) -> Moved:
        """Push the blocks of the request's leading ``target.token_ids`` (those after the
        target's cached prefix) into the target's pre-copy reservation and commit them
        there, while the request decodes on. Raises WrongState (not decoding), BadRequest,
        LayoutMismatch, or MoveFailed (the push failed); the request is untouched either
        way."""
        if self._sender is None:
            raise WrongState("this decode worker has no KV sender: its streams cannot move")
        mismatch = layout_mismatch(self._layout, target.layout)
        if mismatch is not None:
            raise LayoutMismatch(mismatch)
        bs, n = self._layout.block_size, len(target.token_ids)
        if target.skip_tokens % bs or not 0 <= target.skip_tokens < n:
            raise BadRequest("skip_tokens", f"{target.skip_tokens} is not a multiple of the "
                             f"block size {bs} below the {n} tokens pre-copied")
        try:
            endpoint = parse_endpoint(target.kv_endpoint)
        except ConfigError as exc:
            raise BadRequest("kv_endpoint", str(exc)) from exc
        tokens = list(target.token_ids)

        def pin(e: LLMEngine) -> tuple[Pinned, str]:  # the adapter: what the BEGIN names
            pinned = e.remote.migrate.pin(request_id, tokens)  # UnknownRequestError first
            try:
                return pinned, e.lora_identity(e.live(request_id).request.lora)
            except BaseException:
                e.remote.migrate.unpin(pinned.pin_id)
                raise

        try:
            pinned, adapter = await self._ae.call(pin)
        except NotMovableError as exc:
            raise WrongState(str(exc)) from exc
        except UnknownRequestError as exc:
            raise WrongState(f"request {request_id!r} is not decoding here") from exc
        except InvalidRequestError as exc:
            raise BadRequest(exc.field, exc.message) from exc
        try:
            return await self._push_pinned(request_id, pinned, target, endpoint, adapter)
        finally:  # the push is over (committed, failed or cancelled): the pin goes
            await self._ae.call(lambda e: e.remote.migrate.unpin(pinned.pin_id))

    async def _push_pinned(self, request_id: str, pinned: Pinned, target: PreCopyTarget,
                           endpoint: Endpoint, adapter: str) -> Moved:
        src = pinned.block_ids[target.skip_tokens // self._layout.block_size:]
        if len(target.block_ids) != len(src):
            raise BadRequest("block_ids", f"{len(target.block_ids)} destination blocks for "
                             f"the {len(src)} blocks after the target's cached prefix")
        if FREED in src:
            raise BadRequest("skip_tokens", f"{target.skip_tokens} skipped tokens: the "
                             "blocks after them are not all held here (sliding window)")
        assert self._sender is not None  # precopy refused without one
        t0 = time.monotonic()
        transfer = None
        try:
            transfer = await self._sender.open(target.transfer_id, endpoint, src,
                                               target.block_ids, t0 + self._timeout_s,
                                               adapter)
            transfer.push(0, self._layout.num_layers)
            await self._hold.before_commit(request_id)
            await transfer.commit(0, 0.0)  # a pre-copy's COMMIT runs nothing: no token
        except KvTransferError as exc:
            if transfer is not None and not transfer.done:
                await transfer.abort(f"pre-copy failed: {exc}")
            raise MoveFailed(f"the KV pre-copy to the move's target failed: {exc}") from exc
        except BaseException:
            if transfer is not None and not transfer.done:
                await transfer.abort("pre-copy cancelled")
            raise
        return Moved(self._layout.payload_bytes(self._layout.num_layers, len(src)),
                     time.monotonic() - t0)

    async def push(self, request_id: str, departure: Departure, target: MoveTarget) -> Moved:
        """Push the blocks the target lacks into its reservation and commit the last token
        there. Raises BadRequest, LayoutMismatch, or MoveFailed (nothing committed: the
        request can resume here)."""
        moved = departure.continuation
        mismatch = layout_mismatch(self._layout, target.layout)
        if mismatch is not None:
            raise LayoutMismatch(mismatch)
        if target.last_token != moved.token_ids[-1]:
            raise BadRequest("last_token", f"{target.last_token} is not the request's last "
                             f"token {moved.token_ids[-1]}")
        bs = self._layout.block_size
        kv_tokens = len(moved.token_ids) - 1
        if target.skip_tokens % bs or not 0 <= target.skip_tokens < kv_tokens:
            raise BadRequest("skip_tokens", f"{target.skip_tokens} is not a multiple of the "
                             f"block size {bs} below the {kv_tokens} tokens moved")
        skip = target.skip_tokens // bs
        src = moved.block_ids[skip:]
        if len(target.block_ids) != len(src):
            raise BadRequest("block_ids", f"{len(target.block_ids)} destination blocks for "
                             f"the {len(src)} blocks after the target's cached prefix")
        if FREED in src:  # a target that skips less than this engine freed behind the window
            raise BadRequest("skip_tokens", f"{target.skip_tokens} skipped tokens: the "
                             "blocks after them are not all held here (sliding window)")
        try:
            endpoint = parse_endpoint(target.kv_endpoint)
        except ConfigError as exc:
            raise BadRequest("kv_endpoint", str(exc)) from exc
        assert self._sender is not None  # suspend refused without one
        # BEGIN names the adapter the KV was computed under: the target refuses another.
        adapter = departure.adapter
        t0 = time.monotonic()
        transfer = None
        try:
            transfer = await self._sender.open(target.transfer_id, endpoint, src,
                                               target.block_ids, t0 + self._timeout_s,
                                               adapter)
            transfer.push(0, self._layout.num_layers)
            await self._hold.before_commit(request_id)
            await transfer.commit(target.last_token, 0.0)
        except KvTransferError as exc:
            if transfer is not None and not transfer.done:
                await transfer.abort(f"move failed: {exc}")
            raise MoveFailed(f"the KV push to the move's target failed: {exc}") from exc
        return Moved(self._layout.payload_bytes(self._layout.num_layers, len(src)),
                     time.monotonic() - t0)

    async def close(self) -> None:
        """Close the sender's connections."""
        if self._sender is not None:
            await self._sender.close()
