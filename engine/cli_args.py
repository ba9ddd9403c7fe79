"""Command-line flags for an engine, shared by every process that hosts one.

``add_engine_args`` adds flags that mirror ``EngineConfig``'s fields; ``engine_config_from_args``
builds the validated config back from the parsed namespace.
"""

from __future__ import annotations

import argparse

from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig


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
    g.add_argument("--max-num-seqs", type=int, default=sched.max_num_seqs)
    g.add_argument("--max-num-batched-tokens", type=int, default=sched.max_num_batched_tokens)
    g.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton"])
    g.add_argument("--no-cuda-graphs", action="store_true")
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
        ),
        cache=CacheConfig(
            block_size=args.block_size,
            num_blocks=args.num_blocks,
            kv_cache_memory_gb=args.kv_cache_memory_gb,
            enable_prefix_caching=not args.no_prefix_caching,
        ),
        scheduler=SchedulerConfig(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
        ),
        attention_backend=args.attention_backend,
        use_cuda_graphs=not args.no_cuda_graphs,
    )
