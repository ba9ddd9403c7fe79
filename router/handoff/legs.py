"""The worker RPCs of the handoff, with gRPC failures turned into typed errors.

Every call takes ``timeout`` (the request's remaining time, or None) so a client deadline
bounds both legs. Errors leave as WorkerCallError (unary calls) or LegLostError (a decode
stream that broke because its worker went away).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc

from common.wire import RETRY_AFTER_KEY
from protos.tandem.v1 import tandem_pb2, worker_pb2
from router.errors import DeadlineError, LegLostError, WorkerCallError, WorkerFailedError
from router.membership.worker_clients import WorkerClients

log = logging.getLogger(__name__)

# Codes meaning "this worker (or the path to it) is gone", as opposed to "your request is bad".
WORKER_GONE = frozenset({"UNAVAILABLE", "ABORTED", "UNKNOWN", "INTERNAL", "CANCELLED"})
# Codes that are about the request itself: no other worker would do better.
REQUEST_FAULT = frozenset({"INVALID_ARGUMENT", "OUT_OF_RANGE", "PERMISSION_DENIED"})
_ABORT_TIMEOUT_S = 2.0


def _typed(err: grpc.aio.AioRpcError, endpoint: str, method: str) -> WorkerCallError:
    return WorkerCallError(
        endpoint, method, err.code().name, err.details() or "", _retry_hint(err)
    )


def _retry_hint(err: grpc.aio.AioRpcError) -> int | None:
    """The worker's ``retry-after-ms`` trailing metadata, if it sent a sane one."""
    for key, value in err.trailing_metadata() or ():
        if key == RETRY_AFTER_KEY and isinstance(value, str) and value.isdigit():
            return min(int(value), 60_000)
    return None


async def reserve(
    clients: WorkerClients,
    endpoint: str,
    request: worker_pb2.ReserveRequest,
    timeout: float | None,
) -> worker_pb2.ReserveResponse:
    """DecodeService.Reserve."""
    try:
        return await clients.decode(endpoint).Reserve(request, timeout=timeout)
    except grpc.aio.AioRpcError as err:
        raise _typed(err, endpoint, "Reserve") from err


async def prefill(
    clients: WorkerClients,
    endpoint: str,
    request: worker_pb2.PrefillRequest,
    timeout: float | None,
) -> worker_pb2.PrefillResponse:
    """PrefillService.Prefill (computes, pushes the KV, commits on the decode worker)."""
    try:
        return await clients.prefill(endpoint).Prefill(request, timeout=timeout)
    except grpc.aio.AioRpcError as err:
        raise _typed(err, endpoint, "Prefill") from err


async def prefill_local(
    clients: WorkerClients, endpoint: str, leg_id: str, timeout: float | None
) -> worker_pb2.PrefillResponse:
    """DecodeService.PrefillLocal: the decode worker prefills its own reservation."""
    request = worker_pb2.PrefillLocalRequest(request_id=leg_id)
    try:
        return await clients.decode(endpoint).PrefillLocal(request, timeout=timeout)
    except grpc.aio.AioRpcError as err:
        raise _typed(err, endpoint, "PrefillLocal") from err


async def decode_stream(
    clients: WorkerClients, endpoint: str, leg_id: str, timeout: float | None
) -> AsyncIterator[tandem_pb2.GenerateResponse]:
    """DecodeService.Decode, message by message, ending after the finished one.

    A stream that breaks with a worker-gone code, or ends without a finished message, raises
    LegLostError; any other failure raises WorkerCallError.
    """
    call = clients.decode(endpoint).Decode(
        worker_pb2.DecodeRequest(request_id=leg_id), timeout=timeout
    )
    try:
        while True:
            try:
                message = await call.read()
            except grpc.aio.AioRpcError as err:
                if err.code().name in WORKER_GONE:
                    raise LegLostError(endpoint, f"{err.code().name}: {err.details()}") from err
                raise _typed(err, endpoint, "Decode") from err
            if message is grpc.aio.EOF:
                raise LegLostError(endpoint, "stream ended before the request finished")
            yield message
            if message.finished:
                return
    finally:
        call.cancel()


async def abort(clients: WorkerClients, endpoint: str, leg_id: str, decode: bool) -> bool:
    """Abort ``leg_id`` on a worker; False (logged) when the worker could not be told."""
    stub = clients.decode(endpoint) if decode else clients.prefill(endpoint)
    try:
        reply = await stub.Abort(
            worker_pb2.AbortRequest(request_id=leg_id), timeout=_ABORT_TIMEOUT_S
        )
    except grpc.aio.AioRpcError as err:
        log.warning("Abort(%s) on %s failed: %s", leg_id, endpoint, err.code().name)
        return False
    return bool(reply.found)


def raise_if_fatal(err: WorkerCallError) -> None:
    """Deadline and bad-request failures end the request; anything else may be retried."""
    if err.code_name == "DEADLINE_EXCEEDED":
        raise DeadlineError(f"deadline exceeded during {err.method}") from err
    if err.code_name in REQUEST_FAULT:
        raise WorkerFailedError(str(err), err.code_name) from err
