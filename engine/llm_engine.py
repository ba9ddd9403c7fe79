"""The step-level engine that both worker roles drive.

    add_request ─> Scheduler ─> ModelRunner (forward over the paged cache) ─> Sampler
                       ^                                                        │
                       └──── append token, detokenize, stop checks <────────────┘
KV hooks for disaggregation (see DESIGN.md section 2):
  prefill role: add_request(hold_kv=True, max_tokens=1), a layer hook fires as each layer's KV
                lands, held_block_ids() to read them, release() when the push is done;
  decode role:  reserve_remote() allocates blocks for a prompt computed elsewhere, the
                transfer layer writes them into kv_cache, commit_remote() admits the request
                with its first token, and it continues as if prefilled here.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.request import Request, RequestStatus
from engine.core.scheduler import Scheduler
from engine.detokenizer import IncrementalDetokenizer
from engine.errors import InvalidRequestError, OutOfBlocksError, UnknownRequestError
from engine.loader import resolve_model
from engine.model_runner import ModelRunner
from engine.models.weights import load_model, read_arch, torch_dtype
from engine.outputs import EngineStats, KVLayout, RequestOutput, TokenLogprob
from engine.quant import quantize_model
from engine.quant.gguf_q4 import gguf_source
from engine.sampler import Sampler, SampleResult, SamplingState, skip_draw
from engine.sampling_params import SamplingParams
from engine.spec.build import build_spec_decoder

log = logging.getLogger(__name__)

# layer index, then (request_id, block_ids) of every request whose prefill completes this step
KVLayerHook = Callable[[int, list[tuple[str, list[int]]]], None]


@dataclass(slots=True)
class _Live:
    """Per-request state the engine keeps beside the scheduler's Request."""

    request: Request
    sampling: SamplingState
    detok: IncrementalDetokenizer | None


class LLMEngine:
    """A continuous-batching engine over one model and one paged KV cache."""

    def __init__(self, config: EngineConfig, progress: bool = True) -> None:
        self.config = config
        mc = config.model
        if mc.num_threads is not None:
            torch.set_num_threads(mc.num_threads)
        self.device = torch.device(mc.device)
        self.dtype = torch_dtype(mc.resolved_dtype())
        self.model_path: Path = resolve_model(mc.model, mc.cache_dir)
        self.tokenizer = _load_tokenizer(self.model_path)
        self.max_model_len = mc.max_model_len or 0
        model, arch = self._load(progress)
        self.arch = arch
        cc = config.cache
        per_block = ModelRunner.kv_bytes_per_block(
            arch, cc.block_size, self.dtype, cc.kv_cache_dtype
        )
        num_blocks = cc.num_blocks or max(1, int(cc.kv_cache_memory_gb * 2**30) // per_block)
        self.runner = ModelRunner(
            model, arch, num_blocks, cc.block_size, self.dtype, self.device,
            config.resolved_backend(),
            cuda_graph_batch=config.scheduler.max_num_seqs if config.use_cuda_graphs else 0,
            max_model_len=self.max_model_len,
            kv_cache_dtype=cc.kv_cache_dtype,
            native_kernels=config.use_native_kernels,
        )
        self.kv = KVCacheManager(num_blocks, cc.block_size, cc.enable_prefix_caching)
        sc = config.speculative
        self.scheduler = Scheduler(
            config.scheduler, self.kv, sc.num_speculative_tokens if sc.enabled else 0,
            self.max_model_len,
        )
        self.sampler = Sampler(seed=mc.seed)
        self.spec = build_spec_decoder(  # speculative decoding (None: off)
            sc, model, arch, num_blocks, cc.block_size, self.dtype, self.device,
            config.resolved_backend(), self.sampler, mc.seed, self.max_model_len, mc.cache_dir,
        )
        self.eos_token_ids = frozenset(arch.eos_token_ids)
        self._live: dict[str, _Live] = {}
        self._remote: dict[str, _Live] = {}  # reserved, waiting for KV from a prefill worker
        self._held: dict[str, list[int]] = {}  # finished, blocks kept until release()
        self._ids = itertools.count()
        self._layer_hook: KVLayerHook | None = None
        self.num_steps = 0
        self.num_generated_tokens = 0

    def _load(self, progress: bool):  # -> tuple[LlamaForCausalLM, ModelArch]
        hf_config, arch = read_arch(self.model_path)
        limit = arch.max_position_embeddings
        if arch.sliding_window:  # we attend over the full context: stay where that is exact
            limit = min(limit, arch.sliding_window)
        self.max_model_len = min(self.max_model_len or limit, limit)
        model, arch = load_model(
            self.model_path, self.dtype, self.device, self.max_model_len, progress,
            (hf_config, arch),
        )
        mc = self.config.model
        if mc.quantization != "none":  # engine/quant: swap the linear layers in place
            quantize_model(model, mc.quantization, gguf_source(mc.model))
        return model, arch

    # -- requests --------------------------------------------------------------------------
    def add_request(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        hold_kv: bool = False,
        prior_output_tokens: int = 0,
    ) -> str:
        """Validate and queue a request; returns its id. Raises InvalidRequestError.

        ``prior_output_tokens``: the last this-many prompt tokens were generated earlier (a
        request resumed on another worker); they count as output, see ``_new_live``.
        """
        params = params or SamplingParams()
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._live or request_id in self._remote or request_id in self._held:
            raise InvalidRequestError("request_id", f"{request_id!r} is already in use")
        live = self._new_live(request_id, prompt, params, hold_kv, prior_output_tokens)
        self._live[request_id] = live
        self.scheduler.add(live.request)
        return request_id

    def _new_live(
        self,
        request_id: str,
        prompt: str | Sequence[int],
        params: SamplingParams,
        hold_kv: bool,
        prior: int = 0,
    ) -> _Live:
        """Build a request; with ``prior`` > 0 it resumes one whose last ``prior`` tokens were
        generated elsewhere: it is shaped like a request preempted after generating them (its
        KV is recomputed), so max/min tokens, penalties and stop strings count them as output,
        and a seeded RNG is advanced past their draws."""
        params.validate(self.arch.vocab_size)
        token_ids = self._tokenize(prompt)
        if isinstance(prior, bool) or not 0 <= prior < len(token_ids):
            raise InvalidRequestError(
                "prior_output_tokens", f"{prior!r} must be in [0, {len(token_ids)})"
            )
        if len(token_ids) >= self.max_model_len:
            raise InvalidRequestError(
                "prompt", f"{len(token_ids)} tokens leave no room in the context of "
                f"{self.max_model_len} tokens",
            )
        if self.kv.blocks_needed(len(token_ids) + 1) > self.kv.pool.num_blocks:
            raise InvalidRequestError("prompt", "longer than the whole KV cache can hold")
        if params.stop and self.tokenizer is None:
            raise InvalidRequestError("stop", "stop strings need a tokenizer")
        n_prompt = len(token_ids) - prior
        req = Request(request_id, token_ids[:n_prompt], params, hold_kv=hold_kv,
                      all_token_ids=list(token_ids))
        gen = None
        if params.seed is not None:
            gen = torch.Generator().manual_seed(params.seed)
        sampling = SamplingState(
            params, req.prompt_token_ids, req.output_token_ids, gen, self.eos_token_ids
        )
        for _ in range(prior):
            skip_draw(sampling)
        detok = (
            IncrementalDetokenizer(self.tokenizer, req.prompt_token_ids, params)
            if self.tokenizer is not None
            else None
        )
        if detok is not None:
            for t in token_ids[n_prompt:]:  # already streamed by the earlier leg
                detok.add(t)
        return _Live(req, sampling, detok)

    def _tokenize(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidRequestError("prompt", "this model has no tokenizer: send token ids")
            ids = self.tokenizer.encode(prompt, add_special_tokens=True) if prompt else []
        else:
            ids = list(prompt)
            for t in ids:
                if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.arch.vocab_size:
                    raise InvalidRequestError(
                        "prompt", f"token id {t!r} is outside the vocabulary [0, {self.arch.vocab_size})"
                    )
        if not ids:
            raise InvalidRequestError("prompt", "must not be empty")
        return ids

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request wherever it is and free its blocks; unknown ids are ignored."""
        if request_id in self._held:
            self.release(request_id)
            return None
        live = self._live.pop(request_id, None) or self._remote.pop(request_id, None)
        if live is None:
            return None
        self.scheduler.remove(live.request)
        self.kv.free(request_id)
        if self.spec is not None:
            self.spec.release(request_id)
        live.request.status = RequestStatus.FINISHED_ABORTED
        return self._output(live, [], [], finished=True)

    def has_unfinished(self) -> bool:
        """True while any request is waiting or running (remote reservations excluded)."""
        return self.scheduler.num_unfinished() > 0

    # -- the step --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run the model, sample, and report every request that progressed."""
        sched = self.scheduler.schedule()
        outputs: list[RequestOutput] = []
        for req in sched.unschedulable:  # its context outgrew the whole pool
            outputs.append(self._finish(self._live[req.request_id], RequestStatus.FINISHED_LENGTH))
        if not sched.scheduled:
            return outputs
        self.num_steps += 1
        hook = self._make_layer_hook(sched.scheduled)
        if self.spec is not None:
            self.spec.propose(sched.scheduled, self.kv)  # fills spec_token_ids
        logits, samplers = self.runner.execute(sched.scheduled, self.kv, hook)
        for s in sched.scheduled:
            s.request.num_computed_tokens += s.num_new_tokens
        if samplers:
            states = []
            for s in samplers:
                st = self._live[s.request.request_id].sampling
                st.output_token_ids = s.request.output_token_ids
                states.append(st)
            if logits.device.type != "cpu" and any(_needs_host(st.params) for st in states):
                logits = logits.cpu()  # the sampler's RNG and bookkeeping live on the host
            if self.spec is None:
                results = [[r] for r in self.sampler(logits, states)]
            else:
                results = self.spec.sample(logits, samplers, states)
            for s, res in zip(samplers, results, strict=True):
                if s.num_lookahead:  # roll back the rejected drafts before appending
                    self.scheduler.accept_speculation(s, len(res) - 1)
                outputs.append(self._append(self._live[s.request.request_id], res))
        return outputs

    def _make_layer_hook(self, scheduled) -> Callable[[int], None] | None:
        if self._layer_hook is None:
            return None
        done = [
            (s.request.request_id, self.kv.block_ids(s.request.request_id))
            for s in scheduled
            if s.request.hold_kv and s.samples and s.request.num_output_tokens == 0
        ]
        if not done:
            return None
        user_hook = self._layer_hook
        return lambda layer: user_hook(layer, done)

    def set_layer_hook(self, hook: KVLayerHook | None) -> None:
        """Call ``hook(layer, [(request_id, block_ids)])`` as each layer's KV of requests
        that finish their prefill in a step is written (prefill role, layer-wise push)."""
        self._layer_hook = hook

    def _append(self, live: _Live, results: list[SampleResult]) -> RequestOutput:
        """Append sampled tokens in order (several after a speculative step), stopping at the
        first that finishes the request: nothing past a stop or max_tokens is emitted."""
        req = live.request
        new_ids: list[int] = []
        delta = ""
        lp: list[TokenLogprob] | None = None
        for res in results:
            req.append_token(res.token_id)
            new_ids.append(res.token_id)
            self.num_generated_tokens += 1
            delta += live.detok.add(res.token_id) if live.detok is not None else ""
            if req.params.logprobs is not None and res.logprob is not None:
                lp = lp or []
                lp.append(TokenLogprob(res.token_id, res.logprob, res.top_logprobs or []))
            status = self._check_stop(live, res.token_id)
            if status is not None:
                if live.detok is not None:
                    delta += live.detok.flush()
                return self._finish(live, status, new_ids, delta, lp)
        return self._output(live, new_ids, lp, delta=delta)

    def _check_stop(self, live: _Live, token: int) -> RequestStatus | None:
        req, p = live.request, live.request.params
        n_out = req.num_output_tokens
        if n_out >= p.min_tokens:
            if not p.ignore_eos and token in self.eos_token_ids:
                return RequestStatus.FINISHED_STOPPED
            if token in p.stop_token_ids:
                req.stop_reason = token
                return RequestStatus.FINISHED_STOPPED
            if live.detok is not None and live.detok.stop_reason is not None:
                req.stop_reason = live.detok.stop_reason
                return RequestStatus.FINISHED_STOPPED
        if n_out >= p.max_tokens or req.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _finish(
        self,
        live: _Live,
        status: RequestStatus,
        new_ids: list[int] | None = None,
        delta: str = "",
        lp: list[TokenLogprob] | None = None,
    ) -> RequestOutput:
        req = live.request
        req.status = status
        self.scheduler.remove(req)
        self._live.pop(req.request_id, None)
        if self.spec is not None:
            self.spec.release(req.request_id)
        if req.hold_kv and status is not RequestStatus.FINISHED_ABORTED:
            self._held[req.request_id] = self.kv.block_ids(req.request_id)
        else:
            self.kv.free(req.request_id)
        return self._output(live, new_ids or [], lp, delta=delta, finished=True)

    def _output(
        self,
        live: _Live,
        new_ids: list[int],
        lp: list[TokenLogprob] | None,
        delta: str = "",
        finished: bool = False,
    ) -> RequestOutput:
        req = live.request
        return RequestOutput(
            request_id=req.request_id,
            prompt_token_ids=req.prompt_token_ids,
            new_token_ids=new_ids,
            new_text=delta,
            token_ids=req.output_token_ids,
            text=live.detok.text if live.detok is not None else "",
            finished=finished,
            finish_reason=req.status.value if finished else None,
            stop_reason=req.stop_reason,
            logprobs=lp,
            num_cached_tokens=max(req.num_cached_tokens, 0),
        )

    # -- KV hooks for disaggregation ----------------------------------------------------------
    @property
    def kv_cache(self) -> torch.Tensor:
        """The cache tensor ``[layers, 2, num_blocks, block_size, kv_heads, head_dim]``."""
        return self.runner.kv_cache

    def kv_layout(self) -> KVLayout:
        """What a peer engine must match to exchange blocks with this one."""
        return KVLayout(
            model=self.model_path.name,
            dtype=str(self.dtype).removeprefix("torch."),
            block_size=self.kv.block_size,
            num_layers=self.arch.num_layers,
            num_kv_heads=self.arch.num_kv_heads,
            head_dim=self.arch.head_dim,
            kv_dtype=str(self.kv_cache.dtype).removeprefix("torch."),
        )

    def held_block_ids(self, request_id: str) -> list[int]:
        """Blocks of a finished ``hold_kv`` request, in logical order."""
        if request_id not in self._held:
            raise UnknownRequestError(request_id)
        return self._held[request_id]

    def release(self, request_id: str) -> None:
        """Free a held request's blocks (they stay in the prefix cache). Idempotent."""
        if self._held.pop(request_id, None) is not None:
            self.kv.free(request_id)

    def read_kv(self, block_ids: Sequence[int], layers: slice = slice(None)) -> torch.Tensor:
        """Copy of blocks ``[layers, 2, len(block_ids), bs, kv_heads, head_dim]``."""
        idx = torch.tensor(list(block_ids), dtype=torch.int64, device=self.device)
        return self.kv_cache[layers].index_select(2, idx)

    def write_kv(self, block_ids: Sequence[int], data: torch.Tensor, first_layer: int = 0) -> None:
        """Write received blocks (layout of ``read_kv``) into reserved block ids."""
        idx = torch.tensor(list(block_ids), dtype=torch.int64, device=self.device)
        layers = slice(first_layer, first_layer + data.shape[0])
        self.kv_cache[layers].index_copy_(2, idx, data.to(self.kv_cache.device, self.kv_cache.dtype))

    def reserve_remote(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        prior_output_tokens: int = 0,
    ) -> list[int]:
        """Allocate blocks for a prompt whose KV another engine computes; returns block ids.

        ``prior_output_tokens`` as in ``add_request`` (a migrated request)."""
        if request_id in self._live or request_id in self._remote or request_id in self._held:
            raise InvalidRequestError("request_id", f"{request_id!r} is already in use")
        live = self._new_live(
            request_id, list(prompt_token_ids), params, hold_kv=False, prior=prior_output_tokens
        )
        req = live.request
        req.status = RequestStatus.WAITING_FOR_REMOTE_KV
        if not self.kv.allocate_slots(req, req.num_tokens, cache_tokens=False):
            self.kv.free(request_id)
            raise OutOfBlocksError(
                f"{self.kv.blocks_needed(req.num_tokens)} blocks needed, "
                f"{self.kv.pool.num_free} free"
            )
        req.num_cached_tokens = 0
        self._remote[request_id] = live
        return self.kv.block_ids(request_id)

    def commit_remote(
        self, request_id: str, first_token: int, logprob: float | None = None
    ) -> RequestOutput:
        """The KV of a reserved request has arrived: admit it with its first sampled token."""
        live = self._remote.pop(request_id, None)
        if live is None:
            raise UnknownRequestError(request_id)
        req = live.request
        if not 0 <= first_token < self.arch.vocab_size:
            self._remote[request_id] = live
            raise InvalidRequestError("first_token", f"{first_token} is outside the vocabulary")
        req.num_computed_tokens = req.num_tokens
        self.kv.cache_full_blocks(req, req.num_tokens)
        skip_draw(live.sampling)  # the first token was drawn on the prefill worker
        self._live[request_id] = live
        self.scheduler.admit_running(req)
        res = SampleResult(first_token, logprob, None)
        return self._append(live, [res])

    # -- stats -----------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        """Load and cache counters right now."""
        pool = self.kv.pool
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_waiting_for_remote_kv=len(self._remote),
            num_held=len(self._held),
            num_blocks=pool.num_blocks,
            num_free_blocks=pool.num_free,
            kv_cache_usage=pool.usage(),
            prefix_cache_queries=self.kv.stats.queries,
            prefix_cache_hits=self.kv.stats.hits,
            num_preemptions=self.scheduler.num_preemptions,
            num_steps=self.num_steps,
            num_generated_tokens=self.num_generated_tokens,
            **_spec_stats(self.spec),
        )


def _spec_stats(spec) -> dict[str, float]:  # spec: SpecDecoder | None
    """Speculative-decoding counters for ``EngineStats`` (empty when speculation is off)."""
    if spec is None:
        return {}
    st = spec.stats
    return {
        "spec_proposed_tokens": st.proposed,
        "spec_accepted_tokens": st.accepted,
        "spec_num_steps": st.steps,
        "spec_acceptance_rate": st.acceptance_rate,
        "spec_tokens_per_step": st.tokens_per_step,
    }


def _needs_host(p: SamplingParams) -> bool:
    """Rows that need more than a device-side argmax."""
    return (
        not p.greedy
        or p.logprobs is not None
        or p.min_tokens > 0
        or p.repetition_penalty != 1.0
        or p.presence_penalty != 0.0
        or p.frequency_penalty != 0.0
    )


def _load_tokenizer(path: Path):  # -> PreTrainedTokenizerBase | None
    """The checkpoint's tokenizer, or None for tokenizer-less (random test) checkpoints."""
    if not any((path / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)
