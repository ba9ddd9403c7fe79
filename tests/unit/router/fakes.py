"""Scripted in-process fake workers for the router's handoff tests.

The fakes speak the real protos over real grpc.aio servers on 127.0.0.1:0. Their "model" is a
deterministic function of the sequence so far, so a migrated stream can be compared token for
token with an uninterrupted one. A fake prefill worker "pushes KV" by committing the first
token straight into the fake decode worker named by the reservation's kv_endpoint. A forked
request (``n`` > 1) gets sequence j's first token from ``fork_token``, then goes on with the
same model, so a sequence migrated alone continues exactly as it would have.
"""

from __future__ import annotations

import asyncio
import atexit
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from tandem.common.security.credential import ClusterCredential, new_secret, private_secret_file
from tandem.common.security.grpc_auth import ClusterAuthInterceptor, worker_audience
from tandem.common.wire import (
    BUSY_KEY,
    FAULT_KEY,
    RECEIVER_FAULT,
    RETRY_AFTER_KEY,
    SUSPENDED_FAULT,
)
from tandem.protos.v1 import tandem_pb2, worker_pb2, worker_pb2_grpc


def next_token(seq: list[int]) -> int:
    """The fake model: the next token after ``seq``."""
    return 1000 + (seq[-1] * 31 + len(seq)) % 4000


def fork_token(seq: list[int], j: int) -> int:
    """The fake model's first token of sequence ``j`` of a forked request (j = 0: next_token)."""
    return 1000 + (seq[-1] * 31 + len(seq) + 7 * j) % 4000


def expected_output(prompt: list[int], n: int, index: int = 0) -> list[int]:
    """What an uninterrupted run produces for ``prompt`` and max_tokens ``n`` (sequence
    ``index`` of a forked request)."""
    seq = [*prompt, fork_token(prompt, index)]
    for _ in range(n - 1):
        seq.append(next_token(seq))
    return seq[len(prompt) :]


@dataclass(slots=True)
class Reservation:
    request_id: str
    token_ids: list[int]
    sampling: tandem_pb2.SamplingParams
    prior: int = 0  # tokens of token_ids an earlier leg generated (count toward max_tokens)
    n: int = 1  # sequences of a forked request
    committed: asyncio.Event = field(default_factory=asyncio.Event)
    firsts: list[int] = field(default_factory=list)  # each sequence's first token
    moved_in: bool = False  # a live move's target
    seqs: dict[int, list[int]] = field(default_factory=dict)  # per sequence, so far
    suspended: bool = False  # out of the "batch" for a live move
    precopy: bool = False  # a live move's pre-copy: held once committed, never streamed


class FakeDecode(worker_pb2_grpc.DecodeServiceServicer):
    """A decode worker: reserve, local prefill, stream; can refuse, die or hang on cue."""

    def __init__(self, kv_name: str, registry: dict[str, FakeDecode]) -> None:
        self.kv_name = kv_name
        registry[kv_name] = self
        self.reservations: dict[str, Reservation] = {}
        self.exhausted = False
        self.retry_hint_ms: int | None = None  # sent with RESOURCE_EXHAUSTED when set
        self.busy: str | None = None  # the tandem-busy trailer sent with it when set
        self.reserve_hang = False  # Reserve never answers (until its deadline cancels it)
        self.reserve_limit: int | None = None  # Reserves answered before UNAVAILABLE (gone)
        self.reserve_started = asyncio.Event()
        self.timeouts: dict[str, list[float | None]] = {}  # method -> each call's time left
        self.stats_stuck = False  # Stats never answers (an engine busy with a long step)
        self.die_after: int | None = None  # abort the stream UNAVAILABLE after N messages
        self.forgot = False  # Decode answers NOT_FOUND (the leg dropped, or a restart)
        self.hang_after: int | None = None  # stop sending (until cancelled) after N messages
        self.local_prefills: list[str] = []
        self.local_prefill_s = 0.0  # how long PrefillLocal takes (its engine's compute)
        self.local_prefill_dies = False  # PrefillLocal ends UNAVAILABLE (the worker going away)
        self.aborts: list[str] = []
        self.abort_indexes: list[tuple[str, int | None]] = []  # (request id, sequence or None)
        self.decodes: list[tuple[str, int]] = []  # (request id, sequence) of each Decode
        # Extra WorkerStats fields Stats reports (step costs for the placement model).
        self.stats: dict[str, Any] = {}
        self.aborted = asyncio.Event()
        self.hanging = asyncio.Event()
        self.resume = asyncio.Event()  # set to let a hanging stream go on
        # Send text of its own, as the real worker does: texts over a stream concatenate to
        # text_of(first token + streamed tokens), the first token's text in the first message.
        self.text_of: Callable[[list[int]], str] | None = None
        self.traceparents: dict[str, str] = {}  # method -> the last call's traceparent
        self.layout: worker_pb2.KVLayout | None = None  # sent in Reserve's reply when set
        self.registry = registry
        self.move_fails = False  # MoveOut's push fails at its target (the target's fault)
        self.moves_out: list[worker_pb2.MoveOutRequest] = []
        self.precopy_fails = False  # PreCopy's push fails at its target (the target's fault)
        self.refuses_precopy = False  # a pre-copy's Reserve refused (no prefix cache here)
        self.precopies: list[worker_pb2.PreCopyRequest] = []
        self.precopy_gate: asyncio.Event | None = None  # PreCopy waits for it when set
        self.precopy_started = asyncio.Event()
        self.suspends: list[str] = []

    def commit(self, request_id: str, firsts: list[int]) -> None:
        r = self.reservations[request_id]
        assert len(firsts) == r.n, "one first token per sequence"
        r.firsts = firsts
        r.committed.set()

    async def Reserve(self, request, context):  # noqa: N802
        self.timeouts.setdefault("Reserve", []).append(context.time_remaining())
        _record_traceparent(self.traceparents, "Reserve", context)
        self.reserve_started.set()
        if self.reserve_hang:
            await asyncio.Event().wait()
        if self.reserve_limit is not None and len(self.reservations) >= self.reserve_limit:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "worker going away")
        if request.precopy and self.refuses_precopy:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "precopy: no pre-copy here")
        if self.exhausted:
            trailers = [] if self.retry_hint_ms is None else [(RETRY_AFTER_KEY,
                                                               str(self.retry_hint_ms))]
            if self.busy is not None:
                trailers.append((BUSY_KEY, self.busy))
            if trailers:
                context.set_trailing_metadata(tuple(trailers))
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                "grammar not compiled" if self.busy else "no free blocks")
        self.reservations[request.request_id] = Reservation(
            request.request_id, list(request.token_ids), request.sampling,
            request.prior_output_tokens, request.n or 1, moved_in=request.moved_in,
            precopy=request.precopy,
        )
        return worker_pb2.ReserveResponse(
            transfer_id=request.request_id, block_ids=[1, 2], kv_endpoint=self.kv_name,
            layout=self.layout,
        )

    async def PrefillLocal(self, request, context):  # noqa: N802
        self.local_prefills.append(request.request_id)
        self.timeouts.setdefault("PrefillLocal", []).append(context.time_remaining())
        if self.local_prefill_s:
            await asyncio.sleep(self.local_prefill_s)
        if self.local_prefill_dies:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "worker shutting down")
        r = self.reservations[request.request_id]
        firsts = [fork_token(r.token_ids, j) for j in range(r.n)]
        self.commit(request.request_id, firsts)
        return prefill_response(firsts, prefill_s=0.001)

    async def Decode(self, request, context) -> AsyncIterator[tandem_pb2.GenerateResponse]:  # noqa: N802
        _record_traceparent(self.traceparents, "Decode", context)
        self.decodes.append((request.request_id, request.index))
        if self.forgot:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown request {request.request_id!r}")
        r = self.reservations[request.request_id]
        await r.committed.wait()
        # A sequence read again (resumed after a live move that did not happen) goes on.
        seq = r.seqs.setdefault(request.index, [*r.token_ids, r.firsts[request.index]])
        made, sent, said = len(seq) - len(r.token_ids) + r.prior, 0, ""
        if made >= r.sampling.max_tokens:
            yield tandem_pb2.GenerateResponse(finished=True, finish_reason="length")
            return
        while made < r.sampling.max_tokens:
            if self.die_after is not None and sent >= self.die_after:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "worker died")
            if self.hang_after is not None and sent >= self.hang_after:
                self.hanging.set()
                await self.resume.wait()
                self.hang_after = None
            if r.suspended:  # every token so far is out: the stream ends for the move
                context.set_trailing_metadata(((FAULT_KEY, SUSPENDED_FAULT),))
                await context.abort(grpc.StatusCode.ABORTED, "moving")
            token = next_token(seq)
            seq.append(token)
            made += 1
            sent += 1
            done = made >= r.sampling.max_tokens
            text = ""
            if self.text_of is not None:
                text = self.text_of(seq[len(r.token_ids) :])[len(said) :]
                said += text
            yield tandem_pb2.GenerateResponse(
                token_ids=[token],
                text=text,
                finished=done,
                finish_reason="length" if done else "",
                index=request.index,
            )

    async def Suspend(self, request, context):  # noqa: N802
        self.suspends.append(request.request_id)
        r = self.reservations.get(request.request_id)
        if r is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "unknown request")
        await r.committed.wait()  # as the real worker: one whose KV is arriving is waited for
        r.suspended = True
        self.resume.set()  # a stream held by hang_after goes on, to end for the move
        return worker_pb2.SuspendResponse()

    async def MoveOut(self, request, context):  # noqa: N802
        """The "push": commit the last token on the target fake the reservation names."""
        self.moves_out.append(request)
        r = self.reservations[request.request_id]
        if self.move_fails:
            r.suspended = False
            context.set_trailing_metadata(((FAULT_KEY, RECEIVER_FAULT),))
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the push to the target failed")
        assert request.last_token == r.seqs[0][-1]
        self.registry[request.kv_endpoint].commit(request.transfer_id, [request.last_token])
        del self.reservations[request.request_id]
        return worker_pb2.MoveOutResponse(bytes=4096 * len(request.block_ids))

    async def PreCopy(self, request, context):  # noqa: N802
        """The pre-copy's "push": commit the target fake's pre-copy reservation, the stream
        going on meanwhile."""
        self.precopies.append(request)
        self.precopy_started.set()
        if self.precopy_gate is not None:
            await self.precopy_gate.wait()
        r = self.reservations.get(request.request_id)
        if r is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "unknown request")
        if self.precopy_fails:
            context.set_trailing_metadata(((FAULT_KEY, RECEIVER_FAULT),))
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the pre-copy to the target failed")
        seq = r.seqs.get(request.index, r.token_ids)
        assert list(request.token_ids) == seq[: len(request.token_ids)]
        target = self.registry[request.kv_endpoint].reservations[request.transfer_id]
        assert target.precopy and target.token_ids == list(request.token_ids)
        target.committed.set()
        return worker_pb2.PreCopyResponse(bytes=4096 * len(request.block_ids))

    async def Resume(self, request, context):  # noqa: N802
        r = self.reservations.get(request.request_id)
        resumed = r is not None and r.suspended
        if r is not None:
            r.suspended = False
        return worker_pb2.ResumeResponse(resumed=resumed)

    async def Abort(self, request, context):  # noqa: N802
        self.aborts.append(request.request_id)
        self.abort_indexes.append(
            (request.request_id, request.index if request.HasField("index") else None))
        self.aborted.set()
        return worker_pb2.AbortResponse(found=request.request_id in self.reservations)

    async def Stats(self, request, context):  # noqa: N802
        if self.stats_stuck:
            await asyncio.Event().wait()  # until the caller's deadline cancels it
        return worker_pb2.WorkerStats(
            role=worker_pb2.ROLE_DECODE, num_blocks=100, num_free_blocks=90, **self.stats
        )


class FakePrefill(worker_pb2_grpc.PrefillServiceServicer):
    """A prefill worker: computes the first token and commits it on the decode fake."""

    def __init__(self, decoders: dict[str, FakeDecode]) -> None:
        self._decoders = decoders
        self.fail = False  # answer UNAVAILABLE
        self.receiver_dead = False  # answer UNAVAILABLE saying the push's receiver failed
        self.hang = False  # never answer (until cancelled)
        self.calls: list[str] = []
        self.timeouts: list[float | None] = []  # each Prefill's time left
        self.aborts: list[str] = []
        self.aborted = asyncio.Event()
        self.started = asyncio.Event()
        self.stats: dict[str, Any] = {}  # extra WorkerStats fields, as on FakeDecode
        self.traceparents: dict[str, str] = {}  # as on FakeDecode
        self.push_s = 0.0  # how long its push takes after the first token (a slow link)
        self.gate: asyncio.Event | None = None  # when set: each Prefill waits for it first

    async def Prefill(self, request, context):  # noqa: N802
        self.calls.append(request.request_id)
        _record_traceparent(self.traceparents, "Prefill", context)
        self.timeouts.append(context.time_remaining())
        self.started.set()
        if self.fail:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "prefill worker down")
        if self.receiver_dead:
            self.receiver_dead = False  # the next push (to another decode worker) succeeds
            context.set_trailing_metadata(((FAULT_KEY, RECEIVER_FAULT),))
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                "KV push failed: cannot connect to 10.1.2.3:7100")
        if self.hang:
            await asyncio.Event().wait()
        if self.gate is not None:
            await self.gate.wait()
        firsts = [fork_token(list(request.token_ids), j) for j in range(request.n or 1)]
        if self.push_s:
            await asyncio.sleep(self.push_s)
        self._decoders[request.kv_endpoint].commit(request.transfer_id, firsts)
        return prefill_response(firsts, cached_tokens=16, prefill_s=0.002,
                                transfer_s=0.001 + self.push_s)

    async def Abort(self, request, context):  # noqa: N802
        self.aborts.append(request.request_id)
        self.aborted.set()
        return worker_pb2.AbortResponse(found=True)

    async def Stats(self, request, context):  # noqa: N802
        return worker_pb2.WorkerStats(role=worker_pb2.ROLE_PREFILL, **self.stats)


def _record_traceparent(into: dict[str, str], method: str, context: Any) -> None:
    for key, value in context.invocation_metadata() or ():
        if key == "traceparent":
            into[method] = value


def prefill_response(firsts: list[int], **kw: Any) -> worker_pb2.PrefillResponse:
    """A prefill's reply, every sequence's first token listed when it forked."""
    reply = worker_pb2.PrefillResponse(first_token=firsts[0], **kw)
    if len(firsts) > 1:
        reply.first_tokens.extend(tandem_pb2.TokenLogprob(token_id=t, logprob=-1.0 - j)
                                  for j, t in enumerate(firsts))
    return reply


# The test cluster's credential: fake workers refuse calls without it, as real ones do, and
# the harness's router holds it (its file: ``SECRET_FILE``).
SECRET_FILE = private_secret_file(new_secret())
atexit.register(shutil.rmtree, SECRET_FILE.parent, True)  # its private folder goes with the run
CREDENTIAL = ClusterCredential.from_file(SECRET_FILE)


async def serve(servicer: object, add: object) -> tuple[grpc.aio.Server, str]:
    """Start ``servicer`` on 127.0.0.1:0, members only; returns the server and its endpoint."""
    auth = ClusterAuthInterceptor(CREDENTIAL)
    server = grpc.aio.server(interceptors=[auth])
    add(servicer, server)  # type: ignore[operator]
    port = server.add_insecure_port("127.0.0.1:0")
    auth.answer_to(worker_audience("127.0.0.1", port))  # as a worker does once bound
    await server.start()
    return server, f"127.0.0.1:{port}"
