"""Frozen, validated configuration of the engine, one dataclass per concern.

``EngineConfig.from_kwargs`` builds them from the flat keyword arguments that ``LLM(...)`` and
the CLI accept, so each component receives (and copies) only the fields it uses.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tandem.engine.lora.config import LoraConfig
from tandem.engine.spec.config import SpeculativeConfig

_DTYPES = ("float32", "bfloat16", "float16", "auto")
# fp8 and fp8_e4m3 (vLLM's two spellings) are one cache: e4m3 over per-tensor scales
# (tandem/engine/quant/kv_fp8.py); vLLM's fp8_e5m2 is refused by name.
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16", "int8", "fp8", "fp8_e4m3")
GRAMMAR_COMPILE_BUDGET_S = 10.0  # EngineConfig.grammar_compile_budget_s's default


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Which checkpoint to run, and how."""

    model: str = "smollm2"  # alias, HF directory, or .gguf file
    dtype: str = "auto"  # float32 | bfloat16 | float16 | auto (bf16 on CUDA, fp32 on CPU)
    device: str = "cpu"  # cpu | cuda | cuda:N
    num_threads: int | None = None  # CPU intra-op threads; None keeps torch's default
    # None: the model's limit (tandem/engine/checkpoint.py context_limit); above it the load
    # is refused (ContextLengthError), never silently capped
    max_model_len: int | None = None
    seed: int = 0  # engine RNG for unseeded sampling
    cache_dir: str | None = None  # converted-weights cache (default ~/.cache/tandem)
    # auto (the checkpoint's own format) | none (dequantized) | int8 | int4 | fp8 (a checkpoint
    # stored in FP8: e4m3 in the native CPU kernels, dequantized at load elsewhere)
    # (tandem/engine/quant)
    quantization: str = "auto"

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, got {self.dtype!r}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError("num_threads must be >= 1")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError("max_model_len must be >= 1")
        if self.quantization not in ("auto", "none", "int8", "int4", "fp8"):
            raise ValueError(f"quantization must be auto, none, int8, int4 or fp8, got "
                             f"{self.quantization!r}")

    def resolved_dtype(self) -> str:
        """The dtype actually used: ``auto`` is bf16 on CUDA and fp32 on CPU."""
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if self.device.startswith("cuda") else "float32"


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The paged KV cache: its block size and how many blocks it holds."""

    block_size: int = 16
    num_blocks: int | None = None  # explicit pool size; overrides kv_cache_memory_gb
    kv_cache_memory_gb: float = 1.0  # pool size in GiB when num_blocks is None
    # CUDA: the pool is what this share of the device leaves after weights and activations
    # (tandem/engine/kv_budget.py); overrides kv_cache_memory_gb, num_blocks overrides it
    gpu_memory_utilization: float | None = None
    enable_prefix_caching: bool = True
    # auto (EngineConfig.resolved_kv_cache_dtype) | float32 | bfloat16 | float16 | int8 (+ a
    # scale per head vector, tandem/engine/quant/kv_int8.py) | fp8 = fp8_e4m3 (per-tensor
    # scales, tandem/engine/quant/kv_fp8.py)
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        if self.kv_cache_memory_gb <= 0:
            raise ValueError("kv_cache_memory_gb must be > 0")
        u = self.gpu_memory_utilization
        if u is not None and not 0 < u <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {u}")
        if self.kv_cache_dtype == "fp8_e5m2":
            raise ValueError("kv_cache_dtype fp8_e5m2 is not supported: the fp8 KV cache "
                             "stores e4m3 (fp8 or fp8_e4m3)")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, "
                             f"got {self.kv_cache_dtype!r}")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Continuous batching limits for one step."""

    max_num_seqs: int = 64  # sequences per step
    max_num_batched_tokens: int = 2048  # token budget per step (prefill chunks + decodes)
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0  # cap one request's chunk (0 = budget)

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything one engine needs."""

    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    attention_backend: str = "auto"  # torch | triton | auto (triton on CUDA)
    use_cuda_graphs: bool = True  # replay decode steps from CUDA graphs on CUDA devices
    # CPU (fp32, bf16 or fp16 model): every step takes the fused native forward and an fp32
    # model's quantized layers are PackedLinear (tandem/engine/native); off, or no compiler: torch ops.
    use_native_kernels: bool = True
    # Structured outputs (tandem/engine/structured/grammar_engine.py): CPU seconds one grammar
    # may take to compile before it is refused, and how long a request waits for its compile
    # (None: the budget plus a second); keep the wait under the router's RPC timeout.
    grammar_compile_budget_s: float = GRAMMAR_COMPILE_BUDGET_S
    grammar_compile_wait_s: float | None = None
    # vLLM's --tensor-parallel-size: ranks (processes) one engine's model is split over
    # (tandem/engine/parallel); 1 runs it whole in this process
    tensor_parallel_size: int = 1
    # vLLM's --enable-expert-parallel: in a group, each rank holds whole routed experts of a
    # MoE model (tandem/engine/parallel/plan.py) instead of every expert's slice; a no-op on
    # one rank and on a dense model, as in vLLM
    enable_expert_parallel: bool = False
    lora: LoraConfig = field(default_factory=LoraConfig)  # multi-LoRA (off by default)

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got "
                             f"{self.tensor_parallel_size}")
        # A group's draft runs whole on rank 0 (tandem/engine/spec/draft.py); the target's own
        # first layers cannot be that draft: they are split over the ranks and all-reduce.
        sc = self.speculative
        if self.tensor_parallel_size > 1 and sc.speculative_method == "draft" \
                and not sc.draft_model:
            raise ValueError("a draft of the target's first layers does not run in a "
                             "tensor-parallel group (its layers are split over the ranks): "
                             "name a draft checkpoint (--draft-model), use --speculative "
                             "ngram or --tensor-parallel-size 1")
        if self.attention_backend not in ("torch", "triton", "auto"):
            raise ValueError(f"unknown attention_backend {self.attention_backend!r}")
        wait = self.grammar_compile_wait_s
        if self.grammar_compile_budget_s <= 0 or (wait is not None and wait <= 0):
            raise ValueError("grammar_compile_budget_s and grammar_compile_wait_s must be > 0")
        if self.cache.gpu_memory_utilization is not None and \
                not self.model.device.startswith("cuda"):
            raise ValueError(
                "gpu_memory_utilization sizes the KV cache on CUDA devices; on "
                f"{self.model.device!r} use kv_cache_memory_gb or num_blocks")
        kv, dtype = self.cache.kv_cache_dtype, self.model.resolved_dtype()
        if self.model.device.startswith("cuda") and kv not in (
                "auto", "int8", "fp8", "fp8_e4m3", dtype):
            raise ValueError(f"on CUDA the KV cache holds the model dtype ({dtype}), int8 or "
                             f"fp8, not {kv}")

    def resolved_kv_cache_dtype(self, native: bool | None = None) -> str:
        """What the KV cache stores: ``auto`` is float16 for a float32 model on the CPU's
        fused native path (every decode step reads the whole context's K and V: half the
        bytes, as llama.cpp's default f16 cache; perplexity in docs/bench/quantization.md),
        and the model dtype everywhere else; ``fp8_e4m3`` is ``fp8``. ``native``: whether the
        native kernels will run (the engine knows once it tried to load them); default
        ``use_native_kernels``."""
        kv = self.cache.kv_cache_dtype
        if kv == "fp8_e4m3":  # vLLM's other name for the one fp8 cache
            return "fp8"
        if kv != "auto":
            return kv
        dtype = self.model.resolved_dtype()
        native = self.use_native_kernels if native is None else native
        if dtype == "float32" and self.model.device == "cpu" and native:
            return "float16"
        return dtype

    def resolved_backend(self) -> str:
        """``auto`` picks triton on CUDA and torch elsewhere."""
        if self.attention_backend != "auto":
            return self.attention_backend
        return "triton" if self.model.device.startswith("cuda") else "torch"

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        """Route flat keyword arguments (``model=, block_size=, max_num_seqs=, ...``)."""
        parts: dict[str, dict[str, Any]] = {
            "model": {}, "cache": {}, "scheduler": {}, "speculative": {}
        }
        types = {
            "model": ModelConfig, "cache": CacheConfig, "scheduler": SchedulerConfig,
            "speculative": SpeculativeConfig,
        }
        top: dict[str, Any] = {}
        top_fields = {"attention_backend", "use_cuda_graphs", "use_native_kernels",
                      "grammar_compile_budget_s", "grammar_compile_wait_s",
                      "tensor_parallel_size", "enable_expert_parallel", "lora"}
        for key, value in kwargs.items():
            if key in top_fields:
                top[key] = value
                continue
            for part, typ in types.items():
                if key in {f.name for f in dataclasses.fields(typ)}:
                    parts[part][key] = value
                    break
            else:
                raise TypeError(f"unknown engine option {key!r}")
        return cls(
            model=ModelConfig(**parts["model"]),
            cache=CacheConfig(**parts["cache"]),
            scheduler=SchedulerConfig(**parts["scheduler"]),
            speculative=SpeculativeConfig(**parts["speculative"]),
            **top,
        )
