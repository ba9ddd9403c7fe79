"""Command-line flags for an engine, shared by every process that hosts one.

``add_engine_args`` adds flags that mirror ``EngineConfig``'s fields; ``engine_config_from_args``
builds the validated config back from the parsed namespace.
"""

from __future__ import annotations

import argparse

from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.spec.config import SPEC_METHODS, SpeculativeConfig


def add_engine_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--model``, ``--dtype``, ``--threads``, cache and scheduler flags."""
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default="smollm2", help="alias, HF directory or .gguf file")
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    g.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    g.add_argument("--threads", type=int, default=None, help="CPU threads for this engine")
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--seed", type=int, default=0)
    cache, sched = CacheConfig(), SchedulerConfig()  # slots classes: defaults live on instances
    g.add_argument("--block-size", type=int, default=cache.block_size)
    g.add_argument("--num-blocks", type=int, default=None, help="KV blocks (overrides memory)")
    g.add_argument("--kv-cache-memory-gb", type=float, default=cache.kv_cache_memory_gb)
    g.add_argument("--no-prefix-caching", action="store_true")
    g.add_argument("--quantization", default="auto", choices=["auto", "none", "int8", "int4"],
                   help="weights: auto keeps the checkpoint's own format (a GGUF's Q4_0/Q4_1/"
                        "Q8_0 blocks as stored), none dequantizes, int8/int4 requantize")
    g.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "int8"],
                   help="KV cache storage: the model dtype, or int8 with per-vector scales")
    g.add_argument("--max-num-seqs", type=int, default=sched.max_num_seqs)
    g.add_argument("--max-num-batched-tokens", type=int, default=sched.max_num_batched_tokens)
    g.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton"])
    g.add_argument("--no-cuda-graphs", action="store_true")
    g.add_argument("--no-native-kernels", action="store_true",
                   help="CPU: run steps on torch ops (no fused native forward)")
    spec = SpeculativeConfig()
    g.add_argument("--speculative", default="none", choices=list(SPEC_METHODS),
                   help="speculative decoding proposer (per-request opt-out: speculative=False)")
    g.add_argument("--num-speculative-tokens", type=int, default=spec.num_speculative_tokens)
    g.add_argument("--ngram-max", type=int, default=spec.ngram_max)
    g.add_argument("--ngram-min", type=int, default=spec.ngram_min)
    g.add_argument("--draft-model", default=None, help="draft checkpoint (same tokenizer)")
    g.add_argument("--draft-layers", type=int, default=0,
                   help="draft = the target's first N layers (when no --draft-model)")
    return parser


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The validated EngineConfig for parsed flags (raises ValueError on bad values)."""
    return EngineConfig(
        model=ModelConfig(
            model=args.model,
            dtype=args.dtype,
            device=args.device,
            num_threads=args.threads,
            max_model_len=args.max_model_len,
            seed=args.seed,
            quantization=args.quantization,
        ),
        cache=CacheConfig(
            block_size=args.block_size,
            num_blocks=args.num_blocks,
            kv_cache_memory_gb=args.kv_cache_memory_gb,
            enable_prefix_caching=not args.no_prefix_caching,
            kv_cache_dtype=args.kv_cache_dtype,
        ),
        scheduler=SchedulerConfig(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
        ),
        speculative=SpeculativeConfig(
            speculative_method=args.speculative,
            num_speculative_tokens=args.num_speculative_tokens,
            ngram_max=args.ngram_max,
            ngram_min=args.ngram_min,
            draft_model=args.draft_model,
            draft_layers=args.draft_layers,
        ),
        attention_backend=args.attention_backend,
        use_cuda_graphs=not args.no_cuda_graphs,
        use_native_kernels=not args.no_native_kernels,
    )
