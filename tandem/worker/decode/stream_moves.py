"""The decode worker's live-move RPCs over its streams: PreCopy, Suspend, MoveOut, Resume.

    PreCopy(rid, j, target) ──> the stream of sequence j, decoding: LiveMoves.precopy pushes
        its leading full blocks into the target's pre-copy reservation while it decodes on
        (the push runs to its end even if the caller goes away; nothing here changes)
    Suspend(rid, j) ──> the stream of the request's sequence j (0 unless it is forked),
        once decoding (one whose KV is still arriving is waited for): LiveMoves.suspend
        (engine: out of the batch) ──> its Decode reader gets Suspended after every token so
        far; the stream is kept, under the attach lease (``MoveHost.await_reader``)
    MoveOut(rid, j, target) ──> claimed (a second MoveOut or a Resume finds nothing) ──>
        LiveMoves.push ──> committed there: the reply, then sequence j aborted here (its
                           blocks freed, but those its siblings still share; the stream
                           forgotten)
                        ──> MoveFailed: resumed here (a fresh stream, a new Decode reads on)
                        ──> a bad target (BadRequest, LayoutMismatch): still suspended
    Resume(rid, j) ──> a fresh stream, the sequence back in the batch
    the lease runs out first (the router went away) ──> the host aborts it (``holds``)

The stream table itself (streams, groups) is the host's: tandem/worker/decode/service.py;
the reader leases are tandem/worker/decode/reader_leases.py, held by the host.

A forked request's sequences are engine requests of their own once forked (tandem/engine/
core/request.py): each moves alone, named by the engine's id for it (``sequence_id``); on the
target it is a single request whose seed is its fork's (``fork_seed``), so it samples there
what it would have sampled here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Protocol

from tandem.worker.decode.moves import (
    Departure,
    LiveMoves,
    Moved,
    MoveFailed,
    MoveTarget,
    PreCopyTarget,
)
from tandem.worker.decode.streams import RequestStream
from tandem.worker.errors import TransferEnded, WrongState


class MoveHost(Protocol):
    """What the moves need of the decode worker's stream table."""

    def sequence_stream(self, request_id: str, index: int) -> RequestStream:
        """The stream of a request's sequence ``index``. Raises UnknownRequest."""
        ...

    def await_reader(self, stream: RequestStream) -> None:
        """Give ``stream`` the attach lease (its reader, or the move, must come within it)."""
        ...

    def cancel_reader_wait(self, stream: RequestStream) -> None:
        """Stop ``stream``'s attach lease."""
        ...

    def renew_stream(self, old: RequestStream) -> RequestStream:
        """A fresh stream in ``old``'s place (same ids), not started."""
        ...

    async def abort(self, request_id: str, index: int | None = None) -> bool:
        """Stop the request (``index``: that sequence, once forked) and free its blocks."""
        ...


class StreamMoves:
    """Suspend, MoveOut and Resume of one decode worker (see the module docstring)."""

    def __init__(self, host: MoveHost, moves: LiveMoves) -> None:
        self._host = host
        self._moves = moves
        self._suspended: dict[str, Departure] = {}  # by the sequence's engine id
        self._tasks: set[asyncio.Task[Any]] = set()

    def holds(self, sequence_id: str) -> bool:
        """Whether the sequence is suspended here (its stream is kept for a move)."""
        return sequence_id in self._suspended

    def forget(self, sequence_id: str) -> None:
        """The sequence ended (aborted): nothing to move or resume."""
        self._suspended.pop(sequence_id, None)

    async def precopy(self, request_id: str, target: PreCopyTarget, index: int = 0) -> Moved:
        """Push the leading full blocks of a decoding sequence (``index`` of a forked
        request) into ``target``, a pre-copy reservation, while it decodes on. Raises
        UnknownRequest, WrongState (not decoding, or moving already), BadRequest,
        LayoutMismatch or MoveFailed; the sequence runs on here whatever happens."""
        stream = self._host.sequence_stream(request_id, index)
        await stream.under_way()  # a commit being applied: decoding a moment later
        sid = stream.request_id
        if not stream.started or stream.ended or sid in self._suspended:
            raise WrongState(f"request {request_id!r} sequence {index} is not decoding (not "
                             "started, ended or already moving)")
        # Shielded: the pin goes only once the push is over, whoever stops waiting.
        return await asyncio.shield(self._spawn(self._moves.precopy(sid, target)))

    async def suspend(self, request_id: str, index: int = 0) -> int:
        """Take a decoding sequence (``index`` of a forked request) out of the batch for a
        live move; its Decode stream ends after every token so far. Returns its output token
        count. Raises UnknownRequest, or WrongState when it cannot move now (ended, already
        moving: the reason says which); it then runs on. A request whose KV is still
        arriving is waited for."""
        stream = self._host.sequence_stream(request_id, index)
        # A reservation whose KV is arriving decodes once committed (a move's target just
        # committed, say): wait for that, within the caller's deadline.
        await stream.under_way()
        sid = stream.request_id
        if stream.ended or sid in self._suspended:
            raise WrongState(f"request {request_id!r} sequence {index} is not decoding (ended "
                             "or already moving)")
        departure = await self._moves.suspend(sid)
        self._suspended[sid] = departure
        return departure.continuation.num_output_tokens

    async def move_out(self, request_id: str, target: MoveTarget, index: int = 0) -> Moved:
        """Push a suspended sequence's KV into ``target`` and commit it there, then free it
        here. A push that fails resumes it here and raises MoveFailed; a bad target raises
        BadRequest or LayoutMismatch (it stays suspended: Resume, or its lease ends it)."""
        return await asyncio.shield(self._spawn(self._move_out(request_id, index, target)))

    async def _move_out(self, request_id: str, index: int, target: MoveTarget) -> Moved:
        stream = self._host.sequence_stream(request_id, index)
        sid = stream.request_id
        departure = self._suspended.pop(sid, None)  # claimed: one move at a time
        if departure is None:
            raise WrongState(f"request {request_id!r} sequence {index} is not suspended")
        self._host.cancel_reader_wait(stream)
        try:
            moved = await self._moves.push(sid, departure, target)
        except MoveFailed:
            await self._resume(stream)
            raise
        except BaseException:
            self._suspended[sid] = departure  # still suspended: Resume, or its lease,
            self._host.await_reader(stream)  # ends it
            raise
        # Committed on the target: freed here, while the caller already reads on there.
        self._spawn(self._host.abort(request_id, index))
        return moved

    async def resume(self, request_id: str, index: int = 0) -> bool:
        """Put a suspended sequence back into the batch (a new Decode call reads on); False
        when it is not suspended."""
        stream = self._host.sequence_stream(request_id, index)
        if self._suspended.pop(stream.request_id, None) is None:
            return False
        self._host.cancel_reader_wait(stream)
        return await asyncio.shield(self._spawn(self._resume(stream)))

    async def _resume(self, old: RequestStream) -> bool:
        """A fresh stream for a suspended sequence, back in the batch, awaiting its reader."""
        stream = self._host.renew_stream(old)
        if await self._moves.resume(old.request_id):
            stream.start()
        else:
            stream.end(TransferEnded("request ended while it was moving"))
        self._host.await_reader(stream)
        return True

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
