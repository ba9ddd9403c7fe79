"""The step-level engine that both worker roles drive.

    add_request ─> Scheduler ─> spec.propose ─> ModelRunner (forward over the paged cache)
                       ^                                      │
                       │                          spec.sample (the plain sampler when off)
                       └── OutputProcessor: append, detokenize, stop checks <┘

Disaggregation (DESIGN.md section 2) goes through the engine's KV connector, ``engine.remote``
(tandem/engine/kv_connector/): ``remote.decode`` reserves prompts computed elsewhere and commits
them, ``remote.prefill`` runs prompts holding their KV (a layer hook fires as each layer's KV
lands) and releases them. It reaches the engine only through the ``LiveRequestHost`` methods
below (``new_live``, ``track``, ``live``, ``untrack``, ``fork``, ``append``).

Forked requests (``n`` > 1, tandem/engine/core/request.py): one prompt computed once, then n
sequences sharing its blocks. Colocated, the step that computes the prompt forks it and
samples n first tokens from its last row (sequence j with seed + j); disaggregated, the
prefill worker does that and the decode role's ``commit_forked`` forks the reservation
with the n tokens it committed (one reservation, one push).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

import torch

from tandem.engine.checkpoint import load_checkpoint
from tandem.engine.config import EngineConfig
from tandem.engine.core.kv_cache_manager import KVCacheManager, PrefixCacheStats
from tandem.engine.core.output_processor import OutputProcessor
from tandem.engine.core.remote_kv import RemoteState
from tandem.engine.core.request import FORK_SEPARATOR, RequestStatus
from tandem.engine.core.scheduler import ScheduledRequest, Scheduler
from tandem.engine.errors import InvalidRequestError
from tandem.engine.kv_budget import pool_blocks
from tandem.engine.kv_connector import KVConnector, describe_cache
from tandem.engine.lora.manager import LoraManager
from tandem.engine.model_runner import ModelRunner
from tandem.engine.models.weights import torch_dtype
from tandem.engine.models.windows import block_free_window
from tandem.engine.outputs import (
    MAX_REPORTED_HASHES,
    EngineStats,
    RequestOutput,
    SampleResult,
)
from tandem.engine.parallel.collectives import rank_threads
from tandem.engine.parallel.group import RankGroup, runner_settings
from tandem.engine.parallel.plan import plan_shards
from tandem.engine.parallel.shard import local_arch
from tandem.engine.prompt_logprobs import record_prompt_logprobs
from tandem.engine.request_factory import LiveRequest, RequestFactory
from tandem.engine.runner_config import RunnerConfig
from tandem.engine.sampler import Sampler
from tandem.engine.sampling_params import SamplingParams
from tandem.engine.spec.build import build_spec_decoder, load_draft
from tandem.engine.spec.verifier import SpecStats
from tandem.engine.step_cost_feed import StepCostFeed
from tandem.engine.structured.grammar_engine import GrammarEngine


class LLMEngine:
    """A continuous-batching engine over one model and one paged KV cache."""

    def __init__(self, config: EngineConfig, progress: bool = True,
                 follower_module: str | None = None) -> None:
        """``follower_module``: what ranks 1..N-1 of a tensor-parallel group run (``python -m``;
        None: tandem.engine.parallel.follower); a worker names its own, which serves the
        engine's follower with an agent beside it (``RankGroup.agents``)."""
        self.config = config
        mc = config.model
        tp = config.tensor_parallel_size
        if mc.num_threads is not None or tp > 1:
            torch.set_num_threads(rank_threads(mc.num_threads, tp))
        self.device = torch.device(mc.device)
        self.dtype = torch_dtype(mc.resolved_dtype())
        # ranks 1..tp-1 (tandem/engine/parallel): spawned first, they load their shards while
        # this process loads rank 0's
        self.group = RankGroup.launch_for(config, self._native_ok(config),
                                          follower_module) if tp > 1 else None
        try:
            self._build(config, progress)
        except BaseException:
            if self.group is not None:
                self.group.close()
            raise

    def _build(self, config: EngineConfig, progress: bool) -> None:
        mc, cc, sc = config.model, config.cache, config.speculative
        tp = config.tensor_parallel_size
        ckpt = load_checkpoint(mc, self.dtype, self.device, progress, self._native_ok(config),
                               tp=(tp, 0) if tp > 1 else None,
                               expert_parallel=config.enable_expert_parallel)
        self.model_path, self.tokenizer, self.arch = ckpt.path, ckpt.tokenizer, ckpt.arch
        self.weights_format, self.weight_bytes = ckpt.weights.format, ckpt.weight_bytes
        self.max_model_len = ckpt.max_model_len
        # what a step costs here (router placement reads it); its observer: a worker's
        # --step-log (tandem/worker/step_log.py)
        self.step_costs = StepCostFeed()
        # "auto"'s float16 cache is the fused native forward's for GQA models: an MLA model's
        # latent cache stays in the model dtype on either path (the torch path attends in it),
        # and a tensor-parallel group's ranks run torch's forward
        self.kv_cache_dtype = config.resolved_kv_cache_dtype(
            self._native_ok(config) and self.arch.mla is None and tp == 1)
        # this rank's heads: each rank's cache holds its own KV heads at the same block ids
        runner_arch = self.arch if ckpt.shard is None else local_arch(self.arch, ckpt.shard)
        per_block = ModelRunner.kv_bytes_per_block(runner_arch, cc.block_size, self.dtype,
                                                   self.kv_cache_dtype)
        # a draft model (rank 0's, whole) is loaded before the pool is sized: the device's
        # memory in use then counts its weights, and each block also costs its KV
        draft = load_draft(sc, ckpt.model, self.arch, self.dtype, self.device,
                           self.max_model_len, mc.cache_dir)
        draft_per_block = 0 if draft is None else ModelRunner.kv_bytes_per_block(
            draft[1], cc.block_size, self.dtype)
        num_blocks = cc.num_blocks or pool_blocks(  # each rank's device's (free, total) now
            config, runner_arch, per_block, self.dtype.itemsize,
            lambda: [torch.cuda.mem_get_info(self.device), *(self.group.memory() if self.group
                                                             is not None else ())],
            draft_per_block)
        rc = RunnerConfig(
            num_blocks, cc.block_size, self.dtype, self.device, config.resolved_backend(),
            self.max_model_len, self.kv_cache_dtype,
            cuda_graph_batch=config.scheduler.max_num_seqs if config.use_cuda_graphs else 0,
            native_kernels=config.use_native_kernels, tensor_parallel=tp > 1,
        )
        if self.group is not None:
            lora = ({"max_lora_rank": config.lora.max_lora_rank, "max_cpu_loras":
                     config.lora.max_cpu_loras} if config.lora.enabled else None)
            self.group.start({**runner_settings(rc), "lora": lora})
        self.runner = ModelRunner(ckpt.model, runner_arch, rc, self.group)
        # Blocks behind every layer's sliding window go back to the pool as a request runs;
        # not with a draft model, whose own pass over a request may start far behind it.
        free_window = None if sc.speculative_method == "draft" else block_free_window(self.arch)
        self.kv = KVCacheManager(num_blocks, cc.block_size, cc.enable_prefix_caching,
                                 free_window)
        self.loras = (LoraManager(config.lora, ckpt.model, self.arch, self.dtype, self.device,
                                  ckpt.shard, self.group)
                      if config.lora.enabled else None)
        self.runner.lora = self.loras
        self.scheduler = Scheduler(
            config.scheduler, self.kv, sc.num_speculative_tokens if sc.enabled else 0,
            self.max_model_len, config.lora.max_loras if config.lora.enabled else 0)
        self.sampler = Sampler(seed=mc.seed)
        # a no-op decoder when speculation is off
        self.spec = build_spec_decoder(sc, draft, rc, self.sampler, mc.seed)
        self.eos_token_ids = frozenset(self.arch.eos_token_ids)
        self.grammars = (
            GrammarEngine(self.tokenizer, self.arch.vocab_size, self.eos_token_ids,
                          config.grammar_compile_budget_s, config.grammar_compile_wait_s)
            if self.tokenizer is not None else None
        )
        self.requests = RequestFactory(self.tokenizer, self.arch.vocab_size,
                                       self.eos_token_ids, self.max_model_len, self.kv,
                                       self.grammars, self.loras)
        self.outputs = OutputProcessor(self.eos_token_ids, self.max_model_len)
        self._live: dict[str, LiveRequest] = {}  # waiting, running and reserved requests
        self._ids = itertools.count()
        self.num_steps = 0
        cache = self.runner.kv_cache
        self.remote = KVConnector(  # the disaggregation seam: .decode and .prefill roles
            self, self.kv, self.scheduler, self.outputs, self.arch.vocab_size, cache,
            describe_cache(cache, runner_arch, self.model_path.name, self.dtype, cc.block_size,
                           tp, self.runner.fp8_scales.layout if self.runner.fp8_scales else "",
                           self._kv_head_ranges(tp)))

    def _kv_head_ranges(self, tp: int) -> tuple[tuple[int, int], ...]:
        """Each rank's KV heads in a group of ``tp`` (empty for one process)."""
        if tp == 1:
            return ()
        a = self.arch  # the heads alone say where KV lives (the MLP widths were checked)
        plan = plan_shards(tp, num_heads=a.num_heads, num_kv_heads=a.num_kv_heads,
                           head_dim=a.head_dim, intermediate_size=0, mla=a.mla is not None)
        return tuple((s.start, s.stop) for s in plan.kv_head_ranges())

    def close(self) -> None:
        """Stop the other ranks of a tensor-parallel group (nothing to do for one rank)."""
        if self.group is not None:
            self.group.close()
            self.group = None

    # -- requests --------------------------------------------------------------------------
    @staticmethod
    def _native_ok(config: EngineConfig) -> bool:
        """Whether this engine's CPU steps will run the native kernels (their layout then
        holds the quantized weights)."""
        if not config.use_native_kernels or config.model.device != "cpu":
            return False
        from tandem.engine.native import load

        return load() is not None

    def add_request(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        prior_output_tokens: int = 0,
        n: int = 1,
    ) -> str:
        """Validate and queue a request; returns its id. Raises InvalidRequestError.

        ``prior_output_tokens``: the last this-many prompt tokens were generated earlier (a
        request resumed on another worker); they count as output, see ``new_live``.
        ``n`` > 1: the request forks into n sequences once its prompt is computed; their
        outputs come under ``sequence_id(request_id, j)`` (j = 0 is ``request_id``).
        """
        live = self.new_live(request_id, prompt, params or SamplingParams(), False,
                             prior_output_tokens, n)
        self.track(live)
        self.scheduler.add(live.request)
        return live.request.request_id

    # -- LiveRequestHost: what the KV connector's roles call back into -----------------------
    def new_live(
        self,
        request_id: str | None,
        prompt: str | Sequence[int],
        params: SamplingParams,
        hold_kv: bool = False,
        prior: int = 0,
        n: int = 1,
    ) -> LiveRequest:
        """A new request under an unused id, not tracked yet (see tandem/engine/request_factory.py
        for ``prior`` and ``n``); ids with FORK_SEPARATOR are the engine's own (forked
        sequences); None: a fresh id."""
        request_id = request_id or f"req-{next(self._ids)}"
        if FORK_SEPARATOR in request_id:
            raise InvalidRequestError("request_id", f"must not contain {FORK_SEPARATOR!r}")
        if request_id in self._live or request_id in self.remote.ledger:
            raise InvalidRequestError("request_id", f"{request_id!r} is already in use")
        return self.requests.build(request_id, prompt, params, hold_kv, prior, n)

    def lora_identity(self, name: str) -> str:
        """The identity (``name@digest``) of adapter ``name`` here, "" for the base model.
        Raises InvalidRequestError (unknown adapter, or LoRA off)."""
        if not name:
            return ""
        if self.loras is None:
            raise InvalidRequestError("lora", f"LoRA is not enabled here (adapter {name!r})")
        return self.loras.get(name).identity

    def runs_adapter(self, name: str) -> bool:
        """Whether a request this engine holds (waiting, running, reserved) runs under the
        LoRA adapter ``name``."""
        return any(live.request.lora == name for live in self._live.values())

    def track(self, live: LiveRequest) -> None:
        """Know ``live`` from now on (``new_live`` made it; the caller queues or reserves it)."""
        self._live[live.request.request_id] = live

    def live(self, request_id: str) -> LiveRequest:
        """A tracked request. Raises KeyError."""
        return self._live[request_id]

    def untrack(self, request_id: str) -> LiveRequest:
        """Forget a tracked request that left the engine without a step (an ended
        reservation). Raises KeyError."""
        return self._live.pop(request_id)

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request wherever it is and free its blocks; unknown ids are ignored."""
        entry = self.remote.ledger.get(request_id)
        if entry is not None and entry.state is RemoteState.HELD:
            self.remote.prefill.release(request_id)
            return None
        if entry is not None and entry.transfer_id is not None:
            return self.remote.decode.end(entry.transfer_id)
        if entry is not None and entry.state is RemoteState.SUSPENDED:
            self.remote.ledger.unsuspend(request_id)  # out of the batch: freed like the rest
        live = self._live.get(request_id)
        if live is None:
            return None
        out = self.outputs.finish(live.request, live.detok, RequestStatus.FINISHED_ABORTED)
        self._retire(live)
        return out

    def has_unfinished(self) -> bool:
        """True while any request is waiting or running (remote reservations excluded)."""
        return self.scheduler.num_unfinished() > 0

    # -- the step --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run the model, sample, and report every request that progressed."""
        sched = self.scheduler.schedule()
        outputs: list[RequestOutput] = []
        for req in sched.unschedulable:  # its context outgrew the whole pool
            live = self._live[req.request_id]
            outputs.append(self.outputs.finish(req, live.detok, RequestStatus.FINISHED_LENGTH))
            self._retire(live)
        if not sched.scheduled:
            return outputs
        self.num_steps += 1
        started = time.perf_counter()
        outputs += self._run_step(sched.scheduled)
        self.step_costs.observe(  # adapted: a step with a LoRA row
            sched.scheduled, time.perf_counter() - started,
            self.loras is not None and any(s.request.lora for s in sched.scheduled))
        return outputs

    def _run_step(self, scheduled: list[ScheduledRequest]) -> list[RequestOutput]:
        """Forward, sample and append for one scheduled batch."""
        copies = self.kv.take_copies()  # copy-on-write of forked sequences' shared blocks
        if copies:
            self.runner.copy_blocks(copies)
            self.spec.copy_blocks(copies)
        hook = self.remote.prefill.step_hook(scheduled)
        self.spec.propose(scheduled, self.kv)  # fills spec_token_ids (when speculating)
        logits, samplers, prompt = self.runner.execute(scheduled, self.kv, hook)  # [n, V]
        for s in scheduled:
            s.request.num_computed_tokens += s.num_new_tokens
        logits, samplers = self._fork_samplers(logits, samplers)
        for s, rows in prompt:  # prompt_logprobs: score this chunk's prompt tokens
            record_prompt_logprobs(s.request, s.start, rows)
        outputs = []
        for s in scheduled:  # max_tokens 0: the prompt is scored, nothing is generated
            if s.samples and s.request.params.max_tokens == 0:
                live = self._live[s.request.request_id]
                outputs.append(
                    self.outputs.finish(s.request, live.detok, RequestStatus.FINISHED_LENGTH))
                self._retire(live)
        if not samplers:
            return outputs
        states = []
        for s in samplers:
            st = self._live[s.request.request_id].sampling
            st.output_token_ids = s.request.output_token_ids
            states.append(st)
        if logits.device.type != "cpu" and any(_needs_host(st.params) for st in states):
            logits = logits.cpu()  # the sampler's RNG and bookkeeping live on the host
        results = self.spec.sample(logits, samplers, states)
        for s, res in zip(samplers, results, strict=True):
            if s.num_lookahead:  # roll back the rejected drafts before appending
                self.scheduler.accept_speculation(s, len(res) - 1)
            outputs.append(self.append(self._live[s.request.request_id], res))
        return outputs

    def _fork_samplers(
        self, logits: torch.Tensor, samplers: list[ScheduledRequest]
    ) -> tuple[torch.Tensor, list[ScheduledRequest]]:
        """Fork every request whose prompt this step computed into its n sequences: each new
        sequence samples from its parent's row (logits ``[n, V]`` grows a row per sequence,
        appended after the step's rows in ``samplers`` order)."""
        rows: list[int] = []
        forked: list[ScheduledRequest] = []
        for i, s in enumerate(samplers):
            if s.request.num_forks > 1:
                for child in self.fork(self._live[s.request.request_id]):
                    rows.append(i)
                    forked.append(ScheduledRequest(child.request, s.num_new_tokens, s.start))
        if not forked:
            return logits, samplers
        extra = logits[torch.tensor(rows, device=logits.device)]
        return torch.cat([logits, extra]), samplers + forked

    def fork(self, live: LiveRequest) -> list[LiveRequest]:
        """Sequences 1..n-1 of a running request whose prompt is computed: each shares its
        blocks and joins the running batch (sequence 0 is the request itself)."""
        parent = live.request
        n, parent.num_forks = parent.num_forks, 1
        children = []
        for j in range(1, n):
            child = self.requests.fork(parent, j)
            self.kv.fork(parent.request_id, child.request.request_id)
            self._live[child.request.request_id] = child
            self.scheduler.admit_running(child.request)
            children.append(child)
        return children

    def append(self, live: LiveRequest, results: list[SampleResult]) -> RequestOutput:
        """Append sampled tokens (and feed the grammar); retire the request when finished."""
        out = self.outputs.append(live.request, live.detok, results)
        constraint = live.sampling.constraint
        if constraint is not None:
            for t in out.new_token_ids:  # sampled under its mask: always accepted
                constraint.accept(t)
        if out.finished:
            self._retire(live)
        return out

    def _retire(self, live: LiveRequest) -> None:
        """A finished request leaves the engine: blocks freed, or held for a push."""
        req = live.request
        self.scheduler.remove(req)
        self._live.pop(req.request_id, None)
        self.spec.release(req.request_id)
        if req.hold_kv and req.status is not RequestStatus.FINISHED_ABORTED:
            self.remote.prefill.hold(req)
        else:
            self.kv.free(req.request_id)

    # -- stats -----------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        """Load and cache counters right now."""
        pool, spec = self.kv.pool, self.spec.stats
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_waiting_for_remote_kv=self.remote.decode.num_reserved,
            num_held=self.remote.prefill.num_held,
            num_blocks=pool.num_blocks,
            num_free_blocks=pool.num_free,
            kv_cache_usage=pool.usage(),
            prefix_cache_queries=self.kv.stats.queries,
            prefix_cache_hits=self.kv.stats.hits,
            num_preemptions=self.scheduler.num_preemptions,
            num_steps=self.num_steps,
            num_generated_tokens=self.outputs.num_generated_tokens,
            spec_proposed_tokens=spec.proposed,
            spec_accepted_tokens=spec.accepted,
            spec_num_steps=spec.steps,
            spec_acceptance_rate=spec.acceptance_rate,
            spec_tokens_per_step=spec.tokens_per_step,
            step_costs=self.step_costs.costs(),
            pending_prefill_tokens=self.scheduler.pending_prefill_tokens(),
            max_num_batched_tokens=self.scheduler.budget,
            cached_block_hashes=tuple(pool.cached_hashes(MAX_REPORTED_HASHES)),
            weights_format=self.weights_format,
            loras=self.loras.identities() if self.loras is not None else {},
            num_stranded_blocks=self.kv.stranded_blocks(self._live_request_ids()),
        )

    def reset_counters(self) -> None:
        """Restart the counters :meth:`stats` reports (steps, generated tokens, prefix-cache
        lookups, preemptions, speculation) at zero; the step-cost fit is kept. The start-up
        warm-up (tandem/engine/warmup.py) calls it so a worker's metrics count served traffic only."""
        self.num_steps = 0
        self.outputs.num_generated_tokens = 0
        self.kv.stats = PrefixCacheStats()
        self.scheduler.num_preemptions = 0
        self.spec.stats = SpecStats()

    def _live_request_ids(self) -> list[str]:
        """Every request that may hold KV blocks: scheduled (running, waiting) or pinned
        (reserved for a push, held for one) or pinned for a live move's pre-copy."""
        s = self.scheduler
        return [*(r.request_id for r in s.running), *(r.request_id for r in s.waiting),
                *self.remote.ledger.request_ids(), *self.remote.migrate.pin_ids()]


def _needs_host(p: SamplingParams) -> bool:
    """Rows that need more than a device-side argmax."""
    return (
        not p.greedy
        or p.logprobs is not None
        or p.min_tokens > 0
        or p.repetition_penalty != 1.0
        or p.presence_penalty != 0.0
        or p.frequency_penalty != 0.0
        or p.structured is not None
        or bool(p.logit_bias)
    )
