"""Tandem's model runtime: a paged-KV, continuous-batching engine for the Llama family.

Offline use::

    from engine import LLM, SamplingParams
    outs = LLM(model="smollm2").generate(["Hello"], SamplingParams(max_tokens=32))

Workers drive ``LLMEngine`` step by step (``add_request``, ``step``, ``abort``, KV hooks).
Names are imported lazily, so ``engine.core`` (pure bookkeeping) loads without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LLM": "engine.llm",
    "CompletionOutput": "engine.llm",
    "LLMEngine": "engine.llm_engine",
    "CacheConfig": "engine.config",
    "EngineConfig": "engine.config",
    "ModelConfig": "engine.config",
    "SchedulerConfig": "engine.config",
    "EngineError": "engine.errors",
    "InvalidRequestError": "engine.errors",
    "ModelLoadError": "engine.errors",
    "OutOfBlocksError": "engine.errors",
    "UnknownRequestError": "engine.errors",
    "EngineStats": "engine.outputs",
    "KVCacheSpec": "engine.outputs",
    "RequestOutput": "engine.outputs",
    "TokenLogprob": "engine.outputs",
    "SamplingParams": "engine.sampling_params",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
