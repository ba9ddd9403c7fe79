"""What the engine reports per request and per step."""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.common.step_costs import StepCosts


@dataclass(slots=True)
class TokenLogprob:
    """A token's logprob and, when asked, the top-n alternatives: a sampled token
    (``logprobs``) or a prompt token given the tokens before it (``prompt_logprobs``)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass(slots=True)
class SampleResult:
    """The token the sampler picked for one row, with logprobs of the raw model distribution
    when asked for."""

    token_id: int
    logprob: float | None
    top_logprobs: list[tuple[int, float]] | None


@dataclass(slots=True)
class RequestOutput:
    """A request's progress after a step: what is new, and everything so far."""

    request_id: str
    prompt_token_ids: list[int]
    new_token_ids: list[int]
    new_text: str
    token_ids: list[int]  # all generated tokens so far
    text: str  # all generated text so far
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string that matched
    logprobs: list[TokenLogprob] | None = None  # for new_token_ids, when asked
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    # one per prompt token, the first None (nothing precedes it); only on the output that
    # completes the prefill of a request that asked for prompt_logprobs
    prompt_logprobs: list[TokenLogprob | None] | None = None


MAX_REPORTED_HASHES = 16384  # 128 KiB on the wire; pools beyond it report their newest


@dataclass(slots=True)
class EngineStats:
    """A snapshot of the engine's load, for schedulers, routers and metrics."""

    num_running: int
    num_waiting: int
    num_waiting_for_remote_kv: int
    num_held: int
    num_blocks: int
    num_free_blocks: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    num_steps: int
    num_generated_tokens: int
    # speculative decoding (all 0 when it is off); a "spec step" is one request's verification
    spec_proposed_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_num_steps: int = 0
    spec_acceptance_rate: float = 0.0  # accepted / proposed
    spec_tokens_per_step: float = 0.0  # tokens a speculating request emits per step
    # what a step costs here (fitted from measured steps) and what a new prompt waits behind
    step_costs: StepCosts = field(default_factory=StepCosts)
    pending_prefill_tokens: int = 0
    max_num_batched_tokens: int = 0
    # prefix-cache hashes of the blocks held (the most recently cached, at most
    # MAX_REPORTED_HASHES): what a router matches prompts against
    cached_block_hashes: tuple[int, ...] = ()
    weights_format: str = ""  # tandem/engine/quant's QuantSummary.format of the loaded model
    # the LoRA adapters served: name -> identity (name@digest of the adapter's bytes)
    loras: dict[str, str] = field(default_factory=dict)
    # blocks in use that no running, waiting, reserved or held request holds (a leak: 0)
    num_stranded_blocks: int = 0


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    """What the engine's KV cache tensor holds, for whoever moves its blocks (the workers build
    kv_transfer's ``KvLayout`` from it): ``kv: [num_layers, planes, num_blocks, block_size,
    num_kv_heads, head_dim + scale_bytes / itemsize]``; planes is 2 (K, V), or 1 when
    ``kv_lora_rank`` is set (MLA's latent cache: one head of kv_lora_rank + rope values)."""

    model: str
    dtype: str  # the model's compute dtype
    # the cache's storage dtype ("int8": values + per-vector scales; "float8_e4m3fn": values
    # over per-layer scales, kv_scales)
    kv_dtype: str
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    scale_bytes: int = 0  # bytes of scales after each head vector (int8 caches)
    kv_lora_rank: int = 0  # > 0: the latent cache of multi-head latent attention
    # > 1: the cache of rank 0 of a tensor-parallel group, holding only its KV heads (the
    # others hold theirs): no single-rank peer may exchange blocks with it
    tensor_parallel_size: int = 1
    kv_scales: str = ""  # scales no block carries (fp8: Fp8Scales.layout); "" none
    # each rank's KV heads [start, stop), by rank (tandem/engine/parallel/plan.py); empty for
    # one process, which holds them all
    kv_head_ranges: tuple[tuple[int, int], ...] = ()
