"""The worker RPCs of the handoff, with gRPC failures turned into typed errors.

Every call is bounded. A unary call's timeout is the request's remaining time or the
router's default for that call, whichever is shorter::

    Reserve, Abort        --rpc-timeout-s      (30 s; Abort at most 2 s: it is cleanup)
    Prefill, PrefillLocal --prefill-timeout-s  (600 s: a prefill may queue behind long prompts)
    Decode stream         the request's deadline only; a silent worker is found by keepalive
                          (tandem/common/grpc_keepalive.py) or by the health monitor cutting the call

A call that runs out the router's default (not the client's deadline) is a slow call: it
fails as DEADLINE_EXCEEDED with ``Fault.SLOW``, a failure of that request, which the ledger
retries elsewhere within the request's deadline, never a reason to take the worker out of
the pool (tandem/router/handoff/blame.py); the client's own deadline still ends the request
(DEADLINE_EXCEEDED). Every call is tracked in ``LegCalls.inflight`` so the health monitor can
cut the calls to a worker it took out of the pool (tandem/router/handoff/inflight.py); a cut call
is a worker failure too. A Prefill call is tracked under its decode worker as well: a decode
worker that leaves the pool mid-push cuts it as a failure of the receiver (``Fault.RECEIVER``),
as does the prefill worker's own typed reason (the ``tandem-fault`` trailer,
tandem/common/wire.py). Errors leave as WorkerCallError (unary calls) or LegLostError (a
decode stream that broke because its worker went away).

The handoff speaks plain types (tandem/router/handoff/leg_types.py, Chunk): each call turns
them into its worker message right where it is made, and its reply back right where it
comes (tandem/router/convert/legs.py).

Every call is a client span (``DecodeService/Reserve`` ...) under the request's span, and
carries its W3C ``traceparent`` in the call's metadata: the worker's own span for the call is
its child (tandem/common/obs/tracing.py).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Generator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import grpc

from tandem.common.obs import tracing
from tandem.common.wire import (
    BUSY_KEY,
    FAULT_KEY,
    RECEIVER_FAULT,
    RETRY_AFTER_KEY,
    SUSPENDED_FAULT,
)
from tandem.router.convert import legs as wire
from tandem.router.errors import (
    Busy,
    DeadlineError,
    Fault,
    LegLostError,
    LegSuspendedError,
    WorkerCallError,
    WorkerFailedError,
)
from tandem.router.handoff.inflight import CallCutError, Cancellable, InflightCalls
from tandem.router.handoff.leg_types import DecodeLeg, LegRequest, PrefillReply, Reservation
from tandem.router.membership.worker_clients import WorkerClients
from tandem.router.request import Chunk

log = logging.getLogger(__name__)

# Codes meaning "this worker (or the path to it) is gone", as opposed to "your request is bad".
WORKER_GONE = frozenset({"UNAVAILABLE", "ABORTED", "UNKNOWN", "INTERNAL", "CANCELLED"})
# Codes that are about the request itself: no other worker would do better.
REQUEST_FAULT = frozenset({"INVALID_ARGUMENT", "OUT_OF_RANGE", "PERMISSION_DENIED"})
_ABORT_TIMEOUT_S = 2.0
NOT_FOUND = grpc.StatusCode.NOT_FOUND
_R = TypeVar("_R", covariant=True)


class _UnaryCall(Cancellable, Protocol[_R]):
    """A grpc.aio unary call: cancellable, and awaited for its reply."""

    def __await__(self) -> Generator[Any, None, _R]:
        """The reply."""


@dataclass(frozen=True, slots=True)
class LegCalls:
    """What every worker call needs: the channels, the in-flight tracker, the default bounds
    (RouterConfig's ``rpc_timeout_s`` and ``prefill_timeout_s``)."""

    clients: WorkerClients
    inflight: InflightCalls = field(default_factory=InflightCalls)
    rpc_timeout_s: float = 30.0
    prefill_timeout_s: float = 600.0


def bound(remaining: float | None, default_s: float) -> tuple[float, bool]:
    """A call's timeout: the request's ``remaining`` seconds (None: no deadline) or
    ``default_s``, whichever is shorter; and whether it is the router's default that binds."""
    if remaining is None or default_s < remaining:
        return default_s, True
    return remaining, False


def _call_span(service: str, method: str, endpoint: str, leg_id: str,
               parent: tracing.Parent) -> tracing.Ended:
    """The client span of one worker call (ended, failed or not, when the block is left)."""
    return tracing.span(f"{service}/{method}", parent, kind=tracing.CLIENT, attributes={
        "rpc.system": "grpc", "rpc.service": f"tandem.v1.{service}", "rpc.method": method,
        "server.address": endpoint, "tandem.leg_id": leg_id,
    })


def _typed(err: grpc.aio.AioRpcError, endpoint: str, method: str) -> WorkerCallError:
    return WorkerCallError(
        endpoint, method, err.code().name, err.details() or "", _retry_hint(err), _fault(err),
        _busy(err),
    )


def _retry_hint(err: grpc.aio.AioRpcError) -> int | None:
    """The worker's ``retry-after-ms`` trailing metadata, if it sent a sane one."""
    for key, value in err.trailing_metadata() or ():
        if key == RETRY_AFTER_KEY and isinstance(value, str) and value.isdigit():
            return min(int(value), 60_000)
    return None


def _fault(err: grpc.aio.AioRpcError) -> Fault:
    """Whom the worker's failure points at: its ``tandem-fault`` trailer says when it is its
    KV receiver (any other value, or none, is the worker's own)."""
    for key, value in err.trailing_metadata() or ():
        if key == FAULT_KEY and value == RECEIVER_FAULT:
            return Fault.RECEIVER
        if key == FAULT_KEY and value == SUSPENDED_FAULT:
            return Fault.SUSPENDED
    return Fault.WORKER


def _busy(err: grpc.aio.AioRpcError) -> Busy | None:
    """Why a RESOURCE_EXHAUSTED worker refused, from its ``tandem-busy`` trailer (None: no
    trailer, a value this router does not know, or another code)."""
    if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    for key, value in err.trailing_metadata() or ():
        if key == BUSY_KEY and isinstance(value, str):
            try:
                return Busy(value)
            except ValueError:
                return None
    return None


async def _unary(
    calls: LegCalls,
    endpoint: str,
    method: str,
    call: _UnaryCall[_R],
    timeout: float,
    ours: bool,
    receiver: str | None = None,
) -> _R:
    """Await one tracked unary ``call``; failures as WorkerCallError (see the docstring).
    ``receiver``: the decode worker a Prefill call pushes to (the call is tracked there too)."""
    try:
        with calls.inflight.track(endpoint, call), _also_tracked(calls, receiver, call):
            return await call
    except grpc.aio.AioRpcError as err:
        if ours and err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise WorkerCallError(
                endpoint, method, "DEADLINE_EXCEEDED",
                f"no answer within the router's {timeout:g} s", fault=Fault.SLOW,
            ) from err
        raise _typed(err, endpoint, method) from err
    except CallCutError as cut:
        fault = Fault.WORKER if cut.endpoint == endpoint else Fault.RECEIVER
        raise WorkerCallError(endpoint, method, "UNAVAILABLE", cut.reason, fault=fault) from cut


def _also_tracked(calls: LegCalls, receiver: str | None, call: Cancellable
                  ) -> AbstractContextManager[None]:
    return calls.inflight.track(receiver, call) if receiver is not None else nullcontext()


async def reserve(
    calls: LegCalls,
    endpoint: str,
    leg: LegRequest,
    lease_s: float,
    remaining: float | None,
    parent: tracing.Parent = None,
) -> Reservation:
    """DecodeService.Reserve of ``leg`` (its blocks freed unless committed within
    ``lease_s``), bounded by ``rpc_timeout_s``; a span under ``parent``."""
    timeout, ours = bound(remaining, calls.rpc_timeout_s)
    with _call_span("DecodeService", "Reserve", endpoint, leg.leg_id, parent) as span:
        call = calls.clients.decode(endpoint).Reserve(wire.reserve_request(leg, lease_s),
                                                      timeout=timeout,
                                                      metadata=tracing.metadata(span))
        reply = wire.reservation_from_proto(
            await _unary(calls, endpoint, "Reserve", call, timeout, ours))
        span.set_attribute("tandem.cached_tokens", reply.cached_tokens)
        return reply


async def prefill(
    calls: LegCalls,
    endpoint: str,
    leg: LegRequest,
    reservation: Reservation,
    remaining: float | None,
    parent: tracing.Parent = None,
    receiver: str | None = None,
) -> PrefillReply:
    """PrefillService.Prefill of ``leg`` into ``reservation`` (computes, pushes the KV the
    decode worker lacks, commits there), bounded by ``prefill_timeout_s``; a span under
    ``parent``. ``receiver``: the decode worker holding the reservation (the call is cut, as
    its receiver's failure, when that worker leaves the pool)."""
    timeout, ours = bound(remaining, calls.prefill_timeout_s)
    with _call_span("PrefillService", "Prefill", endpoint, leg.leg_id, parent) as span:
        call = calls.clients.prefill(endpoint).Prefill(wire.prefill_request(leg, reservation),
                                                       timeout=timeout,
                                                       metadata=tracing.metadata(span))
        return wire.prefill_reply_from_proto(
            await _unary(calls, endpoint, "Prefill", call, timeout, ours, receiver))


async def prefill_local(
    calls: LegCalls, endpoint: str, leg_id: str, remaining: float | None,
    parent: tracing.Parent = None,
) -> PrefillReply:
    """DecodeService.PrefillLocal: the decode worker prefills its own reservation (bounded
    by ``prefill_timeout_s``); a span under ``parent``."""
    timeout, ours = bound(remaining, calls.prefill_timeout_s)
    with _call_span("DecodeService", "PrefillLocal", endpoint, leg_id, parent) as span:
        call = calls.clients.decode(endpoint).PrefillLocal(wire.prefill_local_request(leg_id),
                                                           timeout=timeout,
                                                           metadata=tracing.metadata(span))
        return wire.prefill_reply_from_proto(
            await _unary(calls, endpoint, "PrefillLocal", call, timeout, ours))


async def decode_stream(
    calls: LegCalls, endpoint: str, leg_id: str, remaining: float | None, index: int = 0,
    parent: tracing.Parent = None,
) -> AsyncIterator[Chunk]:
    """DecodeService.Decode, message by message as Chunks of sequence ``index`` (which
    sequence of a forked leg), ending after the finished one; a span under ``parent`` for
    the whole stream.

    A stream its worker ended for a live move (DecodeService.Suspend) raises
    LegSuspendedError. A stream that breaks with a worker-gone code, is cut (its worker left
    the pool), or ends without a finished message raises LegLostError (``down`` when the channel failed or the
    cut took the worker out: tandem/router/handoff/blame.py); any other failure raises
    WorkerCallError.
    """
    with _call_span("DecodeService", "Decode", endpoint, leg_id, parent) as span:
        call = calls.clients.decode(endpoint).Decode(
            wire.decode_request(leg_id, index), timeout=remaining,
            metadata=tracing.metadata(span),
        )
        try:
            with calls.inflight.track(endpoint, call):
                while True:
                    try:
                        message = await call.read()
                    except grpc.aio.AioRpcError as err:
                        if _fault(err) is Fault.SUSPENDED:  # every token so far came first
                            raise LegSuspendedError(endpoint) from err
                        if err.code().name in WORKER_GONE or err.code() == NOT_FOUND:
                            # NOT_FOUND: the worker no longer has the leg (it restarted, or
                            # dropped it unread at its attach lease): lost, not the request's.
                            raise LegLostError(
                                endpoint, f"{err.code().name}: {err.details()}",
                                down=err.code() == grpc.StatusCode.UNAVAILABLE,
                            ) from err
                        raise _typed(err, endpoint, "Decode") from err
                    if message is grpc.aio.EOF:
                        raise LegLostError(endpoint, "stream ended before the request finished")
                    chunk = wire.chunk_from_proto(message, index)
                    if chunk.finished:
                        span.end()  # the stream's work is done: the rest is our consumer's
                    yield chunk
                    if chunk.finished:
                        return
        except CallCutError as cut:
            raise LegLostError(endpoint, cut.reason, down=True) from cut
        finally:
            call.cancel()


async def abort(calls: LegCalls, endpoint: str, leg_id: str, decode: bool,
                index: int | None = None, parent: tracing.Parent = None) -> bool:
    """Abort ``leg_id`` on a worker (``index``: only that sequence of a forked decode leg);
    False (logged) when the worker could not be told.

    Bounded by ``rpc_timeout_s`` and at most 2 s: an abort is cleanup that the client's
    answer waits for, and a worker that is not told frees the leg when its lease ends."""
    stub = calls.clients.decode(endpoint) if decode else calls.clients.prefill(endpoint)
    timeout = min(_ABORT_TIMEOUT_S, calls.rpc_timeout_s)
    service = "DecodeService" if decode else "PrefillService"
    with _call_span(service, "Abort", endpoint, leg_id, parent) as span:
        call = stub.Abort(wire.abort_request(leg_id, index),
                          timeout=timeout, metadata=tracing.metadata(span))
        try:
            with calls.inflight.track(endpoint, call):
                reply = await call
        except grpc.aio.AioRpcError as err:
            log.warning("Abort(%s) on %s failed: %s", leg_id, endpoint, err.code().name)
            tracing.fail(span, err)
            return False
        except CallCutError as cut:
            log.warning("Abort(%s) on %s cut: %s", leg_id, endpoint, cut.reason)
            tracing.fail(span, cut)
            return False
        return bool(reply.found)


async def suspend(calls: LegCalls, endpoint: str, leg_id: str, index: int = 0,
                  parent: tracing.Parent = None) -> int:
    """DecodeService.Suspend: take the leg (its sequence ``index``) out of its worker's batch
    for a live move (its Decode stream then ends with LegSuspendedError); its output token
    count. Bounded by ``rpc_timeout_s``."""
    timeout = calls.rpc_timeout_s
    with _call_span("DecodeService", "Suspend", endpoint, leg_id, parent) as span:
        call = calls.clients.decode(endpoint).Suspend(
            wire.suspend_request(leg_id, index), timeout=timeout,
            metadata=tracing.metadata(span))
        reply = await _unary(calls, endpoint, "Suspend", call, timeout, True)
        return int(reply.num_output_tokens)


async def move_out(calls: LegCalls, endpoint: str, leg_id: str, target: Reservation,
                   last_token: int, remaining: float | None, parent: tracing.Parent = None,
                   index: int = 0) -> tuple[int, float]:
    """DecodeService.MoveOut: push the suspended leg's (sequence ``index``'s) KV into ``target`` and commit
    ``last_token`` there; (bytes pushed, seconds). A push that failed at the target fails
    with ``Fault.RECEIVER`` (the leg then runs on at ``endpoint``). Bounded by the request's
    ``remaining`` seconds and ``prefill_timeout_s`` (a push)."""
    timeout, ours = bound(remaining, calls.prefill_timeout_s)
    with _call_span("DecodeService", "MoveOut", endpoint, leg_id, parent) as span:
        call = calls.clients.decode(endpoint).MoveOut(
            wire.move_out_request(leg_id, target, last_token, index), timeout=timeout,
            metadata=tracing.metadata(span))
        reply = await _unary(calls, endpoint, "MoveOut", call, timeout, ours)
        return int(reply.bytes), float(reply.transfer_s)


async def precopy(calls: LegCalls, endpoint: str, leg_id: str, target: DecodeLeg,
                  token_ids: list[int], remaining: float | None,
                  parent: tracing.Parent = None, index: int = 0) -> tuple[int, float]:
    """DecodeService.PreCopy: push the KV of the leg's (sequence ``index``'s) leading
    ``token_ids`` into ``target``'s pre-copy reservation while the leg decodes on; (bytes
    pushed, seconds). A push that failed at the target fails with ``Fault.RECEIVER``, as
    does the call when the target leaves the pool meanwhile (it is tracked there too).
    Bounded by the request's ``remaining`` seconds and ``prefill_timeout_s`` (a push)."""
    timeout, ours = bound(remaining, calls.prefill_timeout_s)
    with _call_span("DecodeService", "PreCopy", endpoint, leg_id, parent) as span:
        call = calls.clients.decode(endpoint).PreCopy(
            wire.precopy_request(leg_id, target.reservation, token_ids, index),
            timeout=timeout, metadata=tracing.metadata(span))
        reply = await _unary(calls, endpoint, "PreCopy", call, timeout, ours, target.endpoint)
        return int(reply.bytes), float(reply.transfer_s)


async def resume(calls: LegCalls, endpoint: str, leg_id: str, index: int = 0,
                 parent: tracing.Parent = None) -> bool:
    """DecodeService.Resume: a suspended leg (sequence ``index``) back into its worker's batch (read it on with
    a new Decode call); False when it is not suspended there. Bounded by ``rpc_timeout_s``."""
    timeout = calls.rpc_timeout_s
    with _call_span("DecodeService", "Resume", endpoint, leg_id, parent) as span:
        call = calls.clients.decode(endpoint).Resume(
            wire.resume_request(leg_id, index), timeout=timeout,
            metadata=tracing.metadata(span))
        reply = await _unary(calls, endpoint, "Resume", call, timeout, True)
        return bool(reply.resumed)


def raise_if_fatal(err: WorkerCallError) -> None:
    """The client's deadline and bad-request failures end the request; anything else (a slow
    call among them) may be retried."""
    if err.code_name == "DEADLINE_EXCEEDED" and err.fault is not Fault.SLOW:
        raise DeadlineError(f"deadline exceeded during {err.method}") from err
    if err.code_name in REQUEST_FAULT:
        raise WorkerFailedError(str(err), err.code_name) from err
