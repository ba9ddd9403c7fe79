"""``tandem.v1.DecodeService`` over gRPC: a thin typed wrapper over ``DecodeWorker``.

Protos in, plain values to the worker, plain values back (``ReserveResult``,
``StreamMessage``, ``FirstToken``, ``WorkerStatus``) made protos here through
``tandem.worker.convert``; typed errors become status codes (``tandem.worker.errors``). Each
call is a span under the router's, its log lines name the leg (``tandem.worker.rpc_context``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

import grpc

from tandem.protos.v1 import tandem_pb2, worker_pb2, worker_pb2_grpc
from tandem.worker.app import worker_status
from tandem.worker.convert import (
    first_token_to_proto,
    layout_from_proto,
    layout_to_proto,
    response_from_output,
    sampling_from_proto,
    status_to_proto,
)
from tandem.worker.decode.moves import MoveTarget, PreCopyTarget
from tandem.worker.decode.service import DecodeWorker
from tandem.worker.errors import abort_with_status
from tandem.worker.rpc_context import serving

Context = grpc.aio.ServicerContext
SERVICE_NAME = worker_pb2.DESCRIPTOR.services_by_name["DecodeService"].full_name


def add_to_server(worker: DecodeWorker, server: grpc.aio.Server) -> None:
    """Serve ``worker`` as the DecodeService of ``server``."""
    worker_pb2_grpc.add_DecodeServiceServicer_to_server(DecodeServicer(worker), server)


class DecodeServicer(worker_pb2_grpc.DecodeServiceServicer):
    """Serves one ``DecodeWorker``."""

    def __init__(self, worker: DecodeWorker) -> None:
        self._worker = worker

    async def Reserve(  # noqa: N802 (gRPC method names)
        self, request: worker_pb2.ReserveRequest, context: Context
    ) -> worker_pb2.ReserveResponse:
        try:
            with serving(context, "DecodeService/Reserve", request.request_id) as span:
                params = sampling_from_proto(request.sampling, request.logprobs)
                params.lora = request.lora
                res = await self._worker.reserve(
                    request.request_id, list(request.token_ids), params, request.lease_s,
                    prior_output_tokens=request.prior_output_tokens, n=request.n or 1,
                    moved_in=request.moved_in, precopy=request.precopy,
                )
                span.set_attributes({"tandem.prompt_tokens": len(request.token_ids),
                                     "tandem.cached_tokens": res.cached_tokens,
                                     "tandem.blocks": len(res.block_ids)})
        except Exception as exc:
            await abort_with_status(context, exc)
            raise
        return worker_pb2.ReserveResponse(
            transfer_id=res.transfer_id, block_ids=res.block_ids, kv_endpoint=res.kv_endpoint,
            layout=layout_to_proto(res.layout), cached_tokens=res.cached_tokens,
            lora_identity=res.lora_identity, skip_tokens=res.skip_tokens,
        )

    async def Decode(  # noqa: N802
        self, request: worker_pb2.DecodeRequest, context: Context
    ) -> AsyncIterator[tandem_pb2.GenerateResponse]:
        try:
            with serving(context, "DecodeService/Decode", request.request_id) as span:
                # Closed however the RPC ends: a reader gone (cancelled, its connection lost)
                # stops the request at once and frees its blocks (DecodeWorker.decode).
                async with aclosing(self._worker.decode(request.request_id,
                                                        request.index)) as messages:
                    async for msg in messages:
                        if msg.finished:
                            span.end()  # the stream's work is done: its close is the router's
                        reply = response_from_output(msg.output, msg.text_prefix)
                        reply.index = msg.index
                        yield reply
        except Exception as exc:
            await abort_with_status(context, exc)
            raise

    async def PrefillLocal(  # noqa: N802
        self, request: worker_pb2.PrefillLocalRequest, context: Context
    ) -> worker_pb2.PrefillResponse:
        try:
            with serving(context, "DecodeService/PrefillLocal", request.request_id):
                first = await self._worker.prefill_local(request.request_id)
        except Exception as exc:
            await abort_with_status(context, exc)
            raise
        return first_token_to_proto(first)

    async def Abort(  # noqa: N802
        self, request: worker_pb2.AbortRequest, context: Context
    ) -> worker_pb2.AbortResponse:
        try:
            with serving(context, "DecodeService/Abort", request.request_id):
                index = request.index if request.HasField("index") else None
                found = await self._worker.abort(request.request_id, index)
        except Exception as exc:
            await abort_with_status(context, exc)
            raise
        return worker_pb2.AbortResponse(found=found)

    async def PreCopy(  # noqa: N802
        self, request: worker_pb2.PreCopyRequest, context: Context
    ) -> worker_pb2.PreCopyResponse:
        try:
            with serving(context, "DecodeService/PreCopy", request.request_id) as span:
                target = PreCopyTarget(request.transfer_id, list(request.block_ids),
                                       request.kv_endpoint, layout_from_proto(request.layout),
                                       request.skip_tokens, list(request.token_ids))
                moved = await self._worker.moves.precopy(request.request_id, target,
                                                         request.index)
                span.set_attributes({"tandem.bytes": moved.bytes,
                                     "tandem.blocks": len(target.block_ids)})
        except Exception as exc:
            await abort_with_status(context, exc)
            raise
        return worker_pb2.PreCopyResponse(bytes=moved.bytes, transfer_s=moved.seconds)

    async def Suspend(  # noqa: N802
        self, request: worker_pb2.SuspendRequest, context: Context
    ) -> worker_pb2.SuspendResponse:
        try:
            with serving(context, "DecodeService/Suspend", request.request_id):
                n = await self._worker.moves.suspend(request.request_id, request.index)
        except Exception as exc:
            await abort_with_status(context, exc)
            raise
        return worker_pb2.SuspendResponse(num_output_tokens=n)

    async def MoveOut(  # noqa: N802
        self, request: worker_pb2.MoveOutRequest, context: Context
    ) -> worker_pb2.MoveOutResponse:
        try:
            with serving(context, "DecodeService/MoveOut", request.request_id) as span:
                target = MoveTarget(request.transfer_id, list(request.block_ids),
                                    request.kv_endpoint, layout_from_proto(request.layout),
                                    request.skip_tokens, request.last_token)
                moved = await self._worker.moves.move_out(request.request_id, target,
                                                          request.index)
                span.set_attributes({"tandem.bytes": moved.bytes,
                                     "tandem.blocks": len(target.block_ids)})
        except Exception as exc:
            await abort_with_status(context, exc)
            raise
        return worker_pb2.MoveOutResponse(bytes=moved.bytes, transfer_s=moved.seconds)

    async def Resume(  # noqa: N802
        self, request: worker_pb2.ResumeRequest, context: Context
    ) -> worker_pb2.ResumeResponse:
        try:
            with serving(context, "DecodeService/Resume", request.request_id):
                resumed = await self._worker.moves.resume(request.request_id, request.index)
        except Exception as exc:
            await abort_with_status(context, exc)
            raise
        return worker_pb2.ResumeResponse(resumed=resumed)

    async def Stats(  # noqa: N802
        self, request: worker_pb2.StatsRequest, context: Context
    ) -> worker_pb2.WorkerStats:
        try:
            return status_to_proto(await worker_status(self._worker, "decode"))
        except Exception as exc:
            await abort_with_status(context, exc)
            raise
