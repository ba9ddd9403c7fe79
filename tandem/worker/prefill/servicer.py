"""``tandem.v1.PrefillService`` over gRPC: a thin typed wrapper over ``PrefillWorker``.

Protos in, plain values to the worker (``PrefillSpec``), plain values back (``FirstToken``,
``WorkerStatus``) made protos here through ``tandem.worker.convert``; typed errors become
status codes (``tandem.worker.errors``). Each call is a span under the router's, its log lines
name the leg (``tandem.worker.rpc_context``); the prefill's own spans (engine, push, commit)
go under it (tandem/worker/prefill/service.py)."""

from __future__ import annotations

import grpc

from tandem.common.obs import tracing
from tandem.protos.v1 import worker_pb2, worker_pb2_grpc
from tandem.worker.app import worker_status
from tandem.worker.convert import (
    first_token_to_proto,
    layout_from_proto,
    sampling_from_proto,
    status_to_proto,
)
from tandem.worker.errors import abort_with_status
from tandem.worker.prefill.service import PrefillSpec, PrefillWorker
from tandem.worker.rpc_context import serving

Context = grpc.aio.ServicerContext
SERVICE_NAME = worker_pb2.DESCRIPTOR.services_by_name["PrefillService"].full_name


def add_to_server(worker: PrefillWorker, server: grpc.aio.Server) -> None:
    """Serve ``worker`` as the PrefillService of ``server``."""
    worker_pb2_grpc.add_PrefillServiceServicer_to_server(PrefillServicer(worker), server)


class PrefillServicer(worker_pb2_grpc.PrefillServiceServicer):
    """Serves one ``PrefillWorker``."""

    def __init__(self, worker: PrefillWorker) -> None:
        self._worker = worker

    async def Prefill(  # noqa: N802 (gRPC method names)
        self, request: worker_pb2.PrefillRequest, context: Context
    ) -> worker_pb2.PrefillResponse:
        try:
            with serving(context, "PrefillService/Prefill", request.request_id) as span:
                spec = spec_from_proto(request, span)
                first = await self._worker.prefill(spec, context.time_remaining())
        except Exception as exc:
            await abort_with_status(context, exc)
            raise
        return first_token_to_proto(first)

    async def Abort(  # noqa: N802
        self, request: worker_pb2.AbortRequest, context: Context
    ) -> worker_pb2.AbortResponse:
        with serving(context, "PrefillService/Abort", request.request_id):
            return worker_pb2.AbortResponse(found=await self._worker.abort(request.request_id))

    async def Stats(  # noqa: N802
        self, request: worker_pb2.StatsRequest, context: Context
    ) -> worker_pb2.WorkerStats:
        try:
            return status_to_proto(await worker_status(self._worker, "prefill"))
        except Exception as exc:
            await abort_with_status(context, exc)
            raise


def spec_from_proto(request: worker_pb2.PrefillRequest, trace: tracing.Span) -> PrefillSpec:
    """One Prefill call as the worker takes it (``trace``: the call's span)."""
    params = sampling_from_proto(request.sampling, request.logprobs)
    params.lora = request.lora
    return PrefillSpec(
        request_id=request.request_id,
        token_ids=list(request.token_ids),
        params=params,
        transfer_id=request.transfer_id,
        block_ids=list(request.block_ids),
        kv_endpoint=request.kv_endpoint,
        layout=layout_from_proto(request.layout),
        prior_output_tokens=request.prior_output_tokens,
        skip_tokens=request.skip_tokens,
        n=request.n or 1,
        trace=trace,
        lora_identity=request.lora_identity,
    )
