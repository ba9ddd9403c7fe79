"""Runs one scheduled step on the device: builds the flattened batch, runs the model.

    scheduled (decodes first) ──> input_ids [T], positions [T], AttentionMetadata
                              ──> model forward (writes KV, attends) ──> hidden [T, H]
                              ──> logits of each sampling request's last row [n, V]
                                  (+ every prompt-scoring row, prompt_logprobs: [m, V])

On the CPU an fp32, bf16 or fp16 model (quantized or not) runs every step through
tandem/engine/native's fused forward: one native call instead of ~450 torch ops, matrix-vector
products at memory speed for decodes (16-bit weights read as they are), a tiled GEMM for
batched decodes and prefill chunks, and the prefill role's layer hook called back between
layers. Rows under LoRA adapters stay on it: the fused forward adds each row's delta itself
(tandem/engine/native/lora_step.py, lora_delta.h: per projection, a shrink and an expand GEMM
per adapter over that adapter's rows). Elsewhere (CUDA, tensor parallel, a model the fused
forward declines) a step with an adapter row takes the torch forward, never a CUDA graph: the
deltas are forward hooks on the torch modules (tandem/engine/lora/manager.py), the reference
the native deltas are tested against.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import torch

from tandem.engine.attention import AttentionMetadata, get_backend
from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.scheduler import ScheduledRequest
from tandem.engine.cuda_graphs import DecodeGraphs
from tandem.engine.lora.manager import LoraManager
from tandem.engine.models.arch import ModelArch
from tandem.engine.models.causal_lm import CausalLM
from tandem.engine.models.linear import attach_fp32_shadows
from tandem.engine.models.weights import torch_dtype
from tandem.engine.parallel.step_wire import StepInputs
from tandem.engine.prompt_logprobs import prompt_rows
from tandem.engine.quant.kv_fp8 import FP8_DTYPE, Fp8KVBackend, fp8_scales
from tandem.engine.quant.kv_int8 import Int8KVBackend, storage_head_dim
from tandem.engine.runner_config import RunnerConfig
from tandem.engine.step_threads import AdaptiveThreads, Lease, LeasedThreads, StepThreads

if TYPE_CHECKING:
    from tandem.engine.native.lora_step import NativeLoras, NativeLoraStep
    from tandem.engine.parallel.group import RankGroup

log = logging.getLogger(__name__)

# (request, raw logits [m, V] of its chunk's positions start .. start + m - 1): the prompt
# rows of a request that asked for prompt_logprobs (tandem/engine/prompt_logprobs.py)
PromptLogits = list[tuple[ScheduledRequest, torch.Tensor]]


class ModelRunner:
    """Owns the model, the KV cache tensor and the attention backend.

    ``step_threads``, when set, gives each fused native step its thread count and is told what
    the step took (tandem/engine/step_threads.py: a decode worker borrowing an idle prefill
    worker's cores, a colocated worker choosing between one core and all); unset, a step runs
    on torch's thread count.

    ``group``, on rank 0 of a tensor-parallel group (tandem/engine/parallel/group.py), is
    handed every forward's inputs and block copies before this rank runs them, so the other
    ranks run the same; ``arch`` is then this rank's share (its heads, KV heads, MLP width)."""

    def __init__(self, model: CausalLM, arch: ModelArch, rc: RunnerConfig,
                 group: RankGroup | None = None) -> None:
        self.model = model
        self.group = group
        self.arch = arch
        self.block_size = rc.block_size
        self.device = rc.device
        self.backend = get_backend(rc.backend)
        quant_kv = rc.kv_cache_dtype in ("int8", "fp8")
        if quant_kv and arch.mla is not None:
            raise ValueError(f"--kv-cache-dtype {rc.kv_cache_dtype} is not supported for "
                             "multi-head latent attention (its latent cache is stored in a "
                             "float dtype)")
        # an fp8 cache's K and V scales, per layer (None: another cache), named in its layout
        self.fp8_scales = fp8_scales(model) if rc.kv_cache_dtype == "fp8" else None
        if self.fp8_scales is None and model.kv_scales is not None:
            log.info("the checkpoint's fp8 KV scales are unused: the KV cache is %s",
                     rc.kv_cache_dtype)
        if rc.kv_cache_dtype == "int8":  # int8 values + a scale per head vector (kv_int8.py)
            self.backend = Int8KVBackend(self.backend)
        elif self.fp8_scales is not None:  # e4m3 over per-layer scales (quant/kv_fp8.py)
            self.backend = Fp8KVBackend(self.backend, self.fp8_scales)
        # [layers, K/V, blocks, block_size, kv heads, head dim]: block b of layer l is kv[l, :, b]
        # (an MLA model: [layers, 1, blocks, block_size, 1, kv_lora_rank + rope dims]).
        shape = (arch.num_layers, arch.kv_planes, rc.num_blocks, rc.block_size,
                 arch.kv_cache_heads, storage_head_dim(arch.kv_cache_dim, rc.kv_cache_dtype))
        kv_dtype = kv_storage_dtype(rc.dtype, rc.kv_cache_dtype)
        if rc.native_kernels and rc.device.type == "cpu":  # steps read blocks all over it
            from tandem.engine.native import huge_pages

            self.kv_cache = huge_pages.zeros(shape, kv_dtype)
        else:
            self.kv_cache = torch.zeros(shape, dtype=kv_dtype, device=rc.device)
        self.graphs: DecodeGraphs | None = None
        # a MoE layer picks its experts' matmuls by the step's routing (a host sync): not
        # capturable, so its decode steps run eagerly
        if (rc.cuda_graph_batch and rc.device.type == "cuda" and rc.backend == "triton"
                and not quant_kv and arch.moe is None and not rc.tensor_parallel):
            self.graphs = DecodeGraphs(
                model, self.kv_cache, self.backend, rc.cuda_graph_batch,
                -(-rc.max_model_len // rc.block_size), rc.block_size,
            )
        self.fused = None
        self.lora: LoraManager | None = None  # set by the engine when it serves adapters
        self._native_loras: NativeLoras | None = None  # the adapters' fused-forward tables
        self.step_threads: StepThreads | None = None
        # Entered around the model's forward alone, its inputs built (the one stretch of a
        # step that reads no bookkeeping: requests, blocks, the prefix cache): AsyncEngine
        # frees its bookkeeping lock there (tandem/engine/async_engine.py).
        self.forward_window: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext
        if rc.native_kernels and rc.device.type == "cpu":
            from tandem.engine.native import FusedForward, unsupported_reason

            reason = ("tensor parallel (each rank runs torch's forward over its shard)"
                      if rc.tensor_parallel else unsupported_reason(model, self.kv_cache.dtype))
            if reason is None:
                from tandem.engine.native import huge_pages

                huge_pages.gather(model)  # one 2 MiB-paged buffer: fewer TLB misses a step
                self.fused = FusedForward(model, kv_scales=self.fp8_scales)
                log.info("fused native CPU forward on (KV cache %s)",
                         str(self.kv_cache.dtype).removeprefix("torch."))
            else:  # torch ops serve it: a bf16 model gets fp32 copies for large steps
                log.info("fused native CPU forward off: %s", reason)
                attach_fp32_shadows(model)

    @staticmethod
    def kv_bytes_per_block(
        arch: ModelArch, block_size: int, dtype: torch.dtype, kv_cache_dtype: str = "auto"
    ) -> int:
        """Bytes one block occupies across all layers, K and V (or MLA's latent)."""
        elem = kv_storage_dtype(dtype, kv_cache_dtype).itemsize
        width = storage_head_dim(arch.kv_cache_dim, kv_cache_dtype)
        return arch.num_layers * arch.kv_planes * block_size * arch.kv_cache_heads * width * elem

    @torch.inference_mode()
    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write of forked sequences: block ``dst`` of every layer (K and V, int8
        scales included; an fp8 cache's scales are per tensor and layer) becomes a copy of block
        ``src``, for each (src, dst) pair. Runs before the step's forward; the same cache
        tensor serves the torch, triton, native and CUDA-graph paths."""
        if self.group is not None and pairs:
            self.group.copy_blocks(pairs)
        copy_kv_blocks(self.kv_cache, pairs)

    @torch.inference_mode()
    def execute(
        self,
        scheduled: list[ScheduledRequest],
        kv: KVCacheManager,
        layer_hook: Callable[[int], None] | None = None,
    ) -> tuple[torch.Tensor, list[ScheduledRequest], PromptLogits]:
        """Run one step; returns logits ``[n, V]`` for the ``n`` requests that sample, and
        the prompt-scoring rows of each chunk that has some.

        A request with draft tokens (speculative decoding) runs as one prefill-like chunk
        ``[last token, d1 .. dk]`` and contributes k+1 consecutive rows, in that order. A
        request with ``max_tokens`` 0 (it only scores its prompt) never samples."""
        order = sorted(scheduled, key=lambda s: s.num_query_tokens != 1)  # decodes first
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        tables: list[list[int]] = []
        query_lens: list[int] = []
        seq_lens: list[int] = []
        sample_rows: list[int] = []
        samplers: list[ScheduledRequest] = []
        scored_rows: list[int] = []  # after the sample rows in the lm_head's row list
        scored: list[tuple[ScheduledRequest, int]] = []
        for s in order:
            req, start, n = s.request, s.start, s.num_query_tokens
            table = kv.block_ids(req.request_id)
            scored_pos = prompt_rows(req, start, s.num_new_tokens)
            if scored_pos:
                scored_rows.extend(range(len(ids), len(ids) + len(scored_pos)))
                scored.append((s, len(scored_pos)))
            ids.extend(req.all_token_ids[start : start + s.num_new_tokens])
            ids.extend(s.spec_token_ids)
            positions.extend(range(start, start + n))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
            tables.append(table)
            query_lens.append(n)
            seq_lens.append(start + n)
            if _samples(s):
                sample_rows.extend(range(len(ids) - 1 - len(s.spec_token_ids), len(ids)))
                samplers.append(s)
        logit_rows = sample_rows + scored_rows
        adapters = self._row_adapters(order)
        if adapters is not None and self.fused is None:  # torch, with the adapters' hooks
            assert self.lora is not None
            with self.lora.step(adapters, self.device):
                return self._torch_step(ids, positions, slots, tables, query_lens,
                                        seq_lens, logit_rows, sample_rows, scored, samplers,
                                        layer_hook, adapters)
        if self.fused is not None:
            seq_index = [i for i, n in enumerate(query_lens) for _ in range(n)]
            rule = self.step_threads
            threads = rule.choose(len(ids)) if rule is not None else None
            lora = self._native_lora(adapters) if adapters is not None else None
            started = time.perf_counter()
            seconds = 0.0
            try:
                with self.forward_window():
                    try:
                        logits = self.fused(ids, positions, seq_index, tables, self.kv_cache,
                                            logit_rows, threads=threads,
                                            layer_hook=layer_hook, lora=lora)
                    finally:  # timed in the window: not any wait for the lock after it
                        seconds = time.perf_counter() - started
            finally:  # a failed step gives back a lease it took, too
                if rule is not None:
                    rule.observed(len(ids), threads, seconds)
            return self._split(logits, len(sample_rows), scored, samplers)
        width = max(len(t) for t in tables)
        if (self.graphs is not None and not scored and len(ids) == len(order)
                and self.graphs.fits(len(ids), width)):
            with self.forward_window():
                logits = self.graphs.run(ids, positions, slots, seq_lens, tables)
            if len(samplers) < len(order):  # no drafts here: one row per request
                keep = [i for i, s in enumerate(order) if _samples(s)]
                logits = logits[torch.tensor(keep, device=self.device)]
            return logits, samplers, []
        return self._torch_step(ids, positions, slots, tables, query_lens, seq_lens,
                                logit_rows, sample_rows, scored, samplers, layer_hook)

    def _row_adapters(self, order: list[ScheduledRequest]) -> list[str] | None:
        """Each row's LoRA adapter ("": the base model), or None for a step without any."""
        if self.lora is None or not any(s.request.lora for s in order):
            return None
        return [s.request.lora for s in order for _ in range(s.num_query_tokens)]

    def _native_lora(self, row_adapters: list[str]) -> NativeLoraStep:
        """The step's adapters for the fused forward: the manager's slots, each adapter's
        native table (made on its first step)."""
        assert self.lora is not None
        if self._native_loras is None:
            from tandem.engine.native.lora_step import NativeLoras

            self._native_loras = NativeLoras(self.arch)
        adapters, row_slots = self.lora.slots(row_adapters)
        return self._native_loras.step(adapters, row_slots, self.lora.adapters.values())

    def _torch_step(
        self, ids: list[int], positions: list[int],
        slots: list[int], tables: list[list[int]], query_lens: list[int], seq_lens: list[int],
        logit_rows: list[int], sample_rows: list[int], scored: list[tuple[ScheduledRequest, int]],
        samplers: list[ScheduledRequest], layer_hook: Callable[[int], None] | None,
        adapters: list[str] | None = None,
    ) -> tuple[torch.Tensor, list[ScheduledRequest], PromptLogits]:
        """The step on torch ops (the model's modules, LoRA hooks included); a
        tensor-parallel group's followers are sent the same inputs (and each row's adapter)
        first."""
        step = StepInputs(ids, positions, slots, tables, query_lens, seq_lens, adapters)
        if self.group is None:
            with self.forward_window():
                hidden = self.run_inputs(step, layer_hook)
        else:
            self.group.step(step)
            try:
                with self.forward_window():
                    hidden = self.run_inputs(step, layer_hook)
            except Exception as exc:  # the other ranks cannot go on without this one
                self.group.abort(exc)
        dev = self.device
        if not logit_rows:
            return hidden.new_empty((0, self.arch.vocab_size), dtype=torch.float32), samplers, []
        rows = torch.tensor(logit_rows, dtype=torch.int64, device=dev)
        logits = self.model.compute_logits(hidden[rows])
        return self._split(logits, len(sample_rows), scored, samplers)

    @torch.inference_mode()
    def run_inputs(self, step: StepInputs, layer_hook: Callable[[int], None] | None = None
                   ) -> torch.Tensor:  # [T, hidden]
        """The model's forward over one flattened batch (writes its KV, attends): the torch
        path of ``execute``, and the whole step of a tensor-parallel follower."""
        dev = self.device
        meta = AttentionMetadata.build(step.query_lens, step.seq_lens, step.tables, step.slots,
                                       self.block_size, dev)
        return self.model(
            torch.tensor(step.ids, dtype=torch.int64, device=dev),
            torch.tensor(step.positions, dtype=torch.int64, device=dev),
            self.kv_cache,
            meta,
            self.backend,
            layer_hook,
        )

    def adapt_threads(self, wide: int, lease: Lease | None = None, measure: bool = True
                      ) -> AdaptiveThreads | LeasedThreads | None:
        """Let every fused step run on this process's threads or on ``wide`` threads,
        whichever measures faster for steps of its size (tandem/engine/step_threads.py); a
        wide step takes ``lease`` first when given (another worker's idle cores), and with
        ``measure`` False runs wide whenever the lease is granted. Narrow is this process's
        thread count, or half of it when ``wide`` is that count itself (a colocated worker
        choosing between one core and all). None, changing nothing, without the fused forward
        or with a single thread to choose."""
        own = torch.get_num_threads()
        narrow = own if wide > own else max(1, own // 2)
        if self.fused is None or wide <= narrow or (lease is None and not measure):
            return None
        rule = (AdaptiveThreads(narrow, wide, lease) if measure
                else LeasedThreads(narrow, wide, lease))  # type: ignore[arg-type]
        self.step_threads = rule
        return rule

    @staticmethod
    def _split(
        logits: torch.Tensor,  # [n + m, V]: the sample rows, then the prompt-scoring rows
        n: int,
        scored: list[tuple[ScheduledRequest, int]],
        samplers: list[ScheduledRequest],
    ) -> tuple[torch.Tensor, list[ScheduledRequest], PromptLogits]:
        prompt: PromptLogits = []
        at = n
        for s, m in scored:
            prompt.append((s, logits[at : at + m]))
            at += m
        return logits[:n], samplers, prompt


def kv_storage_dtype(dtype: torch.dtype, kv_cache_dtype: str) -> torch.dtype:
    """The KV cache tensor's dtype for a model computing in ``dtype``."""
    if kv_cache_dtype == "int8":
        return torch.int8
    if kv_cache_dtype == "fp8":
        return FP8_DTYPE
    return dtype if kv_cache_dtype == "auto" else torch_dtype(kv_cache_dtype)


def copy_kv_blocks(kv_cache: torch.Tensor, pairs: list[tuple[int, int]]) -> None:
    """``kv_cache[:, :, dst] = kv_cache[:, :, src]`` for each (src, dst) pair (a paged cache
    ``[layers, 2, blocks, ...]``); sources are read before any destination is written."""
    if not pairs:
        return
    if kv_cache.dtype == FP8_DTYPE:  # the bytes: torch's CPU indexing has no fp8 kernels
        kv_cache = kv_cache.view(torch.uint8)
    src = torch.tensor([p[0] for p in pairs], dtype=torch.int64, device=kv_cache.device)
    dst = torch.tensor([p[1] for p in pairs], dtype=torch.int64, device=kv_cache.device)
    kv_cache[:, :, dst] = kv_cache[:, :, src]


def _samples(s: ScheduledRequest) -> bool:
    """Whether the step samples for ``s``: it computes its last known token and the request
    generates (``max_tokens`` 0 only scores the prompt)."""
    return s.samples and s.request.params.max_tokens > 0
