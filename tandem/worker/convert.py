"""Proto <-> engine conversions used by both workers (``prefill_worker`` imports this module).

    tandem.v1.SamplingParams + LogprobOptions  ->  engine SamplingParams   (unset = engine default)
    engine RequestOutput                       ->  tandem.v1.GenerateResponse
    engine EngineStats (+ transfer totals, recent window)  ->  tandem.v1.WorkerStats
    engine KVCacheSpec                         ->  kv_transfer KvLayout  ->  tandem.v1.KVLayout

Validation stays in the engine (``SamplingParams.validate``); nothing here checks ranges.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tandem.common import block_hash
from tandem.engine.outputs import EngineStats, KVCacheSpec, RequestOutput, TokenLogprob
from tandem.engine.sampling_params import SamplingParams
from tandem.engine.structured.spec import StructuredOutput
from tandem.kv_transfer import KvLayout
from tandem.protos.v1 import tandem_pb2, worker_pb2
from tandem.worker.metrics import TransferTotals
from tandem.worker.recent import RecentFigures

# Optional scalar fields of tandem.v1.SamplingParams that map 1:1 onto the engine's fields.
_OPTIONAL = (
    "max_tokens", "min_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
    "presence_penalty", "frequency_penalty", "seed", "skip_special_tokens", "speculative",
)
_NO_TRANSFERS = TransferTotals()
_NOTHING_RECENT = RecentFigures()


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
    if kind == "choice":
        return StructuredOutput("choice", tuple(so.choice.choices))
    if kind == "json_object":
        return StructuredOutput("json_object") if so.json_object else None
    return StructuredOutput(kind, getattr(so, kind))


def first_tokens_to_proto(
    first_token: int, logprob: TokenLogprob | None,
    forked: Sequence[tuple[int, TokenLogprob | None]],
) -> list[tandem_pb2.TokenLogprob]:
    """PrefillResponse.first_tokens: every sequence's first token of a forked request, with
    its logprob (0 when none was asked for) and top alternatives; empty for one sequence."""
    if not forked:
        return []
    return [
        tandem_pb2.TokenLogprob(
            token_id=token, logprob=lp.logprob if lp is not None else 0.0,
            top=[tandem_pb2.TopLogprob(token_id=t, logprob=v) for t, v in lp.top] if lp else [],
        )
        for token, lp in [(first_token, logprob), *forked]
    ]


def logprobs_to_proto(logprobs: Sequence[TokenLogprob] | None) -> list[tandem_pb2.TokenLogprob]:
    """The engine's per-token logprobs as protos (empty when none were asked for)."""
    return [
        tandem_pb2.TokenLogprob(
            token_id=lp.token_id, logprob=lp.logprob,
            top=[tandem_pb2.TopLogprob(token_id=t, logprob=v) for t, v in lp.top],
        )
        for lp in logprobs or ()
    ]


def prompt_logprobs_to_proto(
    logprobs: Sequence[TokenLogprob | None] | None, prompt_ids: Sequence[int]
) -> list[tandem_pb2.TokenLogprob]:
    """Prompt logprobs as protos: one per prompt token, the first (no logprob) as NaN."""
    if not logprobs:
        return []
    out = logprobs_to_proto([lp for lp in logprobs if lp is not None])
    if logprobs[0] is None and prompt_ids:
        out.insert(0, tandem_pb2.TokenLogprob(token_id=prompt_ids[0], logprob=math.nan))
    return out


def response_from_output(out: RequestOutput, text_prefix: str = "") -> tandem_pb2.GenerateResponse:
    """One stream message: the output's new tokens and text delta (after ``text_prefix``), and
    on the last message the finish reason, stop reason and usage."""
    msg = tandem_pb2.GenerateResponse(
        request_id=out.request_id,
        token_ids=out.new_token_ids,
        text=text_prefix + out.new_text,
        logprobs=logprobs_to_proto(out.logprobs),
        finished=out.finished,
        prompt_logprobs=prompt_logprobs_to_proto(out.prompt_logprobs, out.prompt_token_ids),
    )
    if out.finished:
        msg.finish_reason = out.finish_reason or ""
        msg.stop_reason = "" if out.stop_reason is None else str(out.stop_reason)
        msg.usage.prompt_tokens = len(out.prompt_token_ids)
        msg.usage.completion_tokens = len(out.token_ids)
        msg.usage.cached_tokens = out.num_cached_tokens
    return msg


def stats_to_proto(
    stats: EngineStats,
    role: worker_pb2.Role.ValueType,
    worker_id: str,
    draining: bool,
    transfer: TransferTotals = _NO_TRANSFERS,
    recent: RecentFigures = _NOTHING_RECENT,
) -> worker_pb2.WorkerStats:
    """Load numbers for the router and live views. ``num_reserved`` counts requests whose blocks
    are pinned for a peer: reservations awaiting KV (decode) or finished prefills still pushing
    (prefill); ``recent`` fills the last-minute percentiles and transfer rate."""
    costs = stats.step_costs
    return worker_pb2.WorkerStats(
        step_base_s=costs.base_s,
        step_per_row_s=costs.per_row_s,
        step_per_prefill_token_s=costs.per_prefill_token_s,
        pending_prefill_tokens=stats.pending_prefill_tokens,
        max_batched_tokens=stats.max_num_batched_tokens,
        role=role,
        worker_id=worker_id,
        num_running=stats.num_running,
        num_waiting=stats.num_waiting,
        num_reserved=stats.num_waiting_for_remote_kv + stats.num_held,
        num_free_blocks=stats.num_free_blocks,
        num_blocks=stats.num_blocks,
        kv_cache_usage=stats.kv_cache_usage,
        prefix_cache_queries=stats.prefix_cache_queries,
        prefix_cache_hits=stats.prefix_cache_hits,
        num_preemptions=stats.num_preemptions,
        draining=draining,
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
    )


def layout_to_proto(layout: KvLayout) -> worker_pb2.KVLayout:
    """The layout as sent to the router: ``dtype`` is the cache's storage dtype (the bytes that
    travel) and ``fingerprint`` the one kv_transfer checks at HELLO."""
    return worker_pb2.KVLayout(
        model=layout.model_id, dtype=layout.kv_dtype, block_size=layout.block_size,
        num_layers=layout.num_layers, num_kv_heads=layout.num_kv_heads,
        head_dim=layout.head_dim, fingerprint=layout.fingerprint,
    )


def layout_mismatch(own: KvLayout, theirs: worker_pb2.KVLayout) -> str | None:
    """None when ``theirs`` is ``own``; else which fields differ, for the error's reason."""
    if theirs.fingerprint == own.fingerprint:
        return None
    mine = layout_to_proto(own)
    diffs = [
        f"{name}: {getattr(theirs, name)!r} (decode) != {getattr(mine, name)!r} (prefill)"
        for name in ("model", "dtype", "block_size", "num_layers", "num_kv_heads", "head_dim")
        if getattr(theirs, name) != getattr(mine, name)
    ]
    diffs.append(f"fingerprint: {theirs.fingerprint!r} != {own.fingerprint!r}")
    return "KV layout mismatch: " + "; ".join(diffs)
