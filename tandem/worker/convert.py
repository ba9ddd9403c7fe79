"""Proto <-> plain value conversions: the one module the gRPC edges call (both roles'
servicers, the registration client); past them, workers speak dataclasses only.

    tandem.v1.SamplingParams + LogprobOptions  ->  engine SamplingParams   (unset = engine default)
    tandem.v1.KVLayout                         <-> LayoutSummary (tandem/worker/layout.py)
    engine RequestOutput (+ text owed)         ->  tandem.v1.GenerateResponse
    FirstToken (tandem/worker/first_token.py)  ->  tandem.v1.PrefillResponse
    WorkerStatus, Registration (reports.py)    ->  tandem.v1.WorkerStats, RegisterRequest
    engine KVCacheSpec                         ->  kv_transfer KvLayout  ->  tandem.v1.KVLayout

Validation stays in the engine (``SamplingParams.validate``); nothing here checks ranges.
"""

from __future__ import annotations

from collections.abc import Sequence

from tandem.common import block_hash
from tandem.engine.outputs import KVCacheSpec, RequestOutput, TokenLogprob
from tandem.engine.sampling_params import SamplingParams
from tandem.engine.structured.spec import StructuredOutput
from tandem.kv_transfer import KvLayout
from tandem.kv_transfer.reshard import GroupKv
from tandem.protos.v1 import tandem_pb2, worker_pb2
from tandem.worker.first_token import FirstToken, prompt_logprob_list
from tandem.worker.layout import LayoutSummary
from tandem.worker.reports import Registration, WorkerStatus

# Optional scalar fields of tandem.v1.SamplingParams that map 1:1 onto the engine's fields.
_OPTIONAL = (
    "max_tokens", "min_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
    "presence_penalty", "frequency_penalty", "seed", "skip_special_tokens", "speculative",
)
_ROLES = {"prefill": worker_pb2.ROLE_PREFILL, "decode": worker_pb2.ROLE_DECODE}


def sampling_from_proto(
    sampling: tandem_pb2.SamplingParams, logprobs: tandem_pb2.LogprobOptions | None = None
) -> SamplingParams:
    """Engine sampling parameters for a request; fields the caller left unset keep the engine's
    defaults. Logprobs are on when ``enabled`` or when alternatives are asked for."""
    kwargs: dict[str, object] = {
        name: getattr(sampling, name) for name in _OPTIONAL if sampling.HasField(name)
    }
    params = SamplingParams(**kwargs)  # type: ignore[arg-type]
    params.stop = list(sampling.stop)
    params.stop_token_ids = list(sampling.stop_token_ids)
    params.ignore_eos = sampling.ignore_eos
    params.include_stop_str_in_output = sampling.include_stop_str_in_output
    if sampling.HasField("structured"):
        params.structured = structured_from_proto(sampling.structured)
    if sampling.logit_bias:
        params.logit_bias = dict(sampling.logit_bias)
    if sampling.HasField("prompt_logprobs"):
        params.prompt_logprobs = sampling.prompt_logprobs
    if logprobs is not None and (logprobs.enabled or logprobs.top_logprobs > 0):
        params.logprobs = logprobs.top_logprobs
    return params


def structured_from_proto(so: tandem_pb2.StructuredOutput) -> StructuredOutput | None:
    """The engine's constraint for a proto one (None when no kind is set)."""
    kind = so.WhichOneof("kind")
    if kind is None:
        return None
    after = so.after_token if so.HasField("after_token") else None
    if kind == "choice":
        return StructuredOutput("choice", tuple(so.choice.choices), after)
    if kind == "json_object":
        return StructuredOutput("json_object", "", after) if so.json_object else None
    return StructuredOutput(kind, getattr(so, kind), after)


def first_token_to_proto(first: FirstToken) -> worker_pb2.PrefillResponse:
    """A prefill's answer (Prefill, PrefillLocal): sequence 0's token, logprob and costs;
    ``first_tokens`` lists every sequence's of a forked request (a missing logprob as 0)."""
    reply = worker_pb2.PrefillResponse(
        first_token=first.token_id, cached_tokens=first.cached_tokens,
        prefill_s=first.prefill_s, transfer_s=first.transfer_s,
        prompt_logprobs=logprobs_to_proto(first.prompt_logprobs),
    )
    if first.logprob is not None:
        reply.logprob = first.logprob.logprob
        reply.first_logprob.CopyFrom(logprobs_to_proto([first.logprob])[0])
    if first.forked:
        reply.first_tokens.extend(
            tandem_pb2.TokenLogprob(
                token_id=token, logprob=lp.logprob if lp is not None else 0.0,
                top=[tandem_pb2.TopLogprob(token_id=t, logprob=v) for t, v in lp.top]
                if lp is not None else [],
            )
            for token, lp in [(first.token_id, first.logprob), *first.forked]
        )
    return reply


def logprobs_to_proto(logprobs: Sequence[TokenLogprob] | None) -> list[tandem_pb2.TokenLogprob]:
    """The engine's per-token logprobs as protos (empty when none were asked for)."""
    return [
        tandem_pb2.TokenLogprob(
            token_id=lp.token_id, logprob=lp.logprob,
            top=[tandem_pb2.TopLogprob(token_id=t, logprob=v) for t, v in lp.top],
        )
        for lp in logprobs or ()
    ]


def response_from_output(out: RequestOutput, text_prefix: str = "") -> tandem_pb2.GenerateResponse:
    """One stream message: the output's new tokens and text delta (after ``text_prefix``), and
    on the last message the finish reason, stop reason and usage."""
    msg = tandem_pb2.GenerateResponse(
        request_id=out.request_id,
        token_ids=out.new_token_ids,
        text=text_prefix + out.new_text,
        logprobs=logprobs_to_proto(out.logprobs),
        finished=out.finished,
        prompt_logprobs=logprobs_to_proto(
            prompt_logprob_list(out.prompt_logprobs, out.prompt_token_ids)),
    )
    if out.finished:
        msg.finish_reason = out.finish_reason or ""
        msg.stop_reason = "" if out.stop_reason is None else str(out.stop_reason)
        msg.usage.prompt_tokens = len(out.prompt_token_ids)
        msg.usage.completion_tokens = len(out.token_ids)
        msg.usage.cached_tokens = out.num_cached_tokens
    return msg


def status_to_proto(status: WorkerStatus) -> worker_pb2.WorkerStats:
    """Load numbers for the router and live views. ``num_reserved`` counts requests whose blocks
    are pinned for a peer: reservations awaiting KV (decode) or finished prefills still pushing
    (prefill); ``recent`` fills the last-minute percentiles and transfer rate."""
    stats, transfer, recent = status.engine, status.transfer, status.recent
    costs = stats.step_costs
    return worker_pb2.WorkerStats(
        step_base_s=costs.base_s,
        step_per_row_s=costs.per_row_s,
        step_per_prefill_token_s=costs.per_prefill_token_s,
        pending_prefill_tokens=stats.pending_prefill_tokens,
        max_batched_tokens=stats.max_num_batched_tokens,
        role=_ROLES[status.role],
        worker_id=status.worker_id,
        num_running=stats.num_running,
        num_waiting=stats.num_waiting,
        num_reserved=stats.num_waiting_for_remote_kv + stats.num_held,
        num_free_blocks=stats.num_free_blocks,
        num_blocks=stats.num_blocks,
        kv_cache_usage=stats.kv_cache_usage,
        prefix_cache_queries=stats.prefix_cache_queries,
        prefix_cache_hits=stats.prefix_cache_hits,
        num_preemptions=stats.num_preemptions,
        draining=status.draining,
        ttft_p50_s=recent.ttft_p50_s,
        ttft_p90_s=recent.ttft_p90_s,
        itl_p50_s=recent.itl_p50_s,
        itl_p90_s=recent.itl_p90_s,
        kv_transfer_bytes_per_s=recent.kv_transfer_bytes_per_s,
        kv_transfer_bytes=transfer.bytes,
        kv_transfer_failures=transfer.failures,
        num_leased_blocks=transfer.leased_blocks,
        cached_block_hashes=block_hash.pack(stats.cached_block_hashes),
        weights_format=stats.weights_format,
        loras=stats.loras,
    )


def registration_to_proto(reg: Registration) -> worker_pb2.RegisterRequest:
    """How a worker introduces itself to a router."""
    return worker_pb2.RegisterRequest(
        role=_ROLES[reg.role], worker_id=reg.worker_id, endpoint=reg.endpoint,
        kv_endpoint=reg.kv_endpoint, layout=layout_to_proto(reg.layout),
    )


def kv_layout(spec: KVCacheSpec) -> KvLayout:
    """The transfer layout of an engine's cache (``LLMEngine.kv_cache_spec()``): the one
    layout type, whose fingerprint kv_transfer checks at HELLO."""
    return KvLayout(
        model_id=spec.model,
        dtype=spec.dtype,
        kv_dtype=spec.kv_dtype,
        block_size=spec.block_size,
        num_layers=spec.num_layers,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        scale_bytes=spec.scale_bytes,
        kv_lora_rank=spec.kv_lora_rank,
        tensor_parallel_size=spec.tensor_parallel_size if spec.tensor_parallel_size > 1 else 0,
        kv_scales=spec.kv_scales,
    )


def kv_group(spec: KVCacheSpec) -> GroupKv:
    """The engine's cache as part of its tensor-parallel group (a group of one for one
    process): what re-sharded pushes route by (tandem/kv_transfer/reshard.py)."""
    layout = kv_layout(spec)
    return GroupKv(layout, spec.kv_head_ranges or ((0, layout.num_kv_heads),))


def layout_to_proto(layout: KvLayout) -> worker_pb2.KVLayout:
    """The layout as sent to the router (``LayoutSummary``: the storage dtype, the bytes that
    travel, and the fingerprint kv_transfer checks at HELLO)."""
    summary = LayoutSummary.of(layout)
    return worker_pb2.KVLayout(
        model=summary.model, dtype=summary.dtype, block_size=summary.block_size,
        num_layers=summary.num_layers, num_kv_heads=summary.num_kv_heads,
        head_dim=summary.head_dim, fingerprint=summary.fingerprint,
        bytes_per_token=summary.bytes_per_token,
    )


def layout_from_proto(layout: worker_pb2.KVLayout) -> LayoutSummary:
    """A peer's layout as the router passed it on."""
    return LayoutSummary(
        model=layout.model, dtype=layout.dtype, block_size=layout.block_size,
        num_layers=layout.num_layers, num_kv_heads=layout.num_kv_heads,
        head_dim=layout.head_dim, fingerprint=layout.fingerprint,
        bytes_per_token=layout.bytes_per_token,
    )
