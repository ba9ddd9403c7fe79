"""``tandem.v1.PrefillService`` over gRPC: a thin typed wrapper over ``PrefillWorker``.

Each call is a span under the router's, its log lines name the leg (``tandem.worker.rpc_context``);
the prefill's own spans (engine, push, commit) go under it (tandem/worker/prefill/service.py)."""

from __future__ import annotations

import grpc

from tandem.protos.v1 import worker_pb2, worker_pb2_grpc
from tandem.worker.app import worker_stats
from tandem.worker.convert import first_tokens_to_proto, logprobs_to_proto, sampling_from_proto
from tandem.worker.errors import abort_with_status
from tandem.worker.prefill.service import PrefillSpec, PrefillWorker
from tandem.worker.rpc_context import serving

Context = grpc.aio.ServicerContext


class PrefillServicer(worker_pb2_grpc.PrefillServiceServicer):
    """Serves one ``PrefillWorker``."""

    def __init__(self, worker: PrefillWorker) -> None:
        self._worker = worker

    async def Prefill(  # noqa: N802 (gRPC method names)
        self, request: worker_pb2.PrefillRequest, context: Context
    ) -> worker_pb2.PrefillResponse:
        try:
            with serving(context, "PrefillService/Prefill", request.request_id) as span:
                spec = PrefillSpec(
                    request_id=request.request_id,
                    token_ids=list(request.token_ids),
                    params=sampling_from_proto(request.sampling, request.logprobs),
                    transfer_id=request.transfer_id,
                    block_ids=list(request.block_ids),
                    kv_endpoint=request.kv_endpoint,
                    layout=request.layout,
                    prior_output_tokens=request.prior_output_tokens,
                    skip_tokens=request.skip_tokens,
                    n=request.n or 1,
                    trace=span,
                )
                res = await self._worker.prefill(spec, context.time_remaining())
        except Exception as exc:
            await abort_with_status(context, exc)
            raise
        reply = worker_pb2.PrefillResponse(
            first_token=res.first_token, cached_tokens=res.cached_tokens,
            prefill_s=res.prefill_s, transfer_s=res.transfer_s,
        )
        if res.logprob is not None:
            reply.logprob = res.logprob.logprob
            reply.first_logprob.CopyFrom(logprobs_to_proto([res.logprob])[0])
        reply.prompt_logprobs.extend(res.prompt_logprobs)
        reply.first_tokens.extend(first_tokens_to_proto(res.first_token, res.logprob, res.forked))
        return reply

    async def Abort(  # noqa: N802
        self, request: worker_pb2.AbortRequest, context: Context
    ) -> worker_pb2.AbortResponse:
        with serving(context, "PrefillService/Abort", request.request_id):
            return worker_pb2.AbortResponse(found=await self._worker.abort(request.request_id))

    async def Stats(  # noqa: N802
        self, request: worker_pb2.StatsRequest, context: Context
    ) -> worker_pb2.WorkerStats:
        try:
            return await worker_stats(self._worker, worker_pb2.ROLE_PREFILL)
        except Exception as exc:
            await abort_with_status(context, exc)
            raise
