"""How the device side of one engine runs: built once by the engine, passed down as one object
to the model runner, the draft model and the speculative builder."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    """The paged KV cache's shape and where and how forwards over it run."""

    num_blocks: int
    block_size: int
    dtype: torch.dtype  # the model's compute dtype
    device: torch.device
    backend: str  # attention backend name (tandem/engine/attention): "torch" | "triton"
    max_model_len: int
    # "auto" (= dtype) | "float32" | "bfloat16" | "float16" | "int8" (+ a scale per head vector)
    # | "fp8" (e4m3 over per-tensor scales)
    kv_cache_dtype: str = "auto"
    cuda_graph_batch: int = 0  # largest decode batch captured in CUDA graphs (0: none)
    native_kernels: bool = False  # CPU: every step through tandem/engine/native's fused forward
    # one rank of a tensor-parallel group (tandem/engine/parallel): torch's forward, whose
    # row-parallel layers all-reduce (the fused native forward and CUDA graphs decline it)
    tensor_parallel: bool = False
