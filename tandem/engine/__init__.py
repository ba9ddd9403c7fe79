"""Tandem's model runtime: a paged-KV, continuous-batching engine for the Llama family.

Offline use::

    from tandem.engine import LLM, SamplingParams
    outs = LLM(model="smollm2").generate(["Hello"], SamplingParams(max_tokens=32))

Workers drive ``LLMEngine`` step by step (``add_request``, ``step``, ``abort``) and its KV
connector for disaggregation (``engine.remote.decode`` / ``engine.remote.prefill``).
Names are imported lazily, so ``tandem.engine.core`` (pure bookkeeping) loads without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LLM": "tandem.engine.llm",
    "CompletionOutput": "tandem.engine.llm",
    "LLMEngine": "tandem.engine.llm_engine",
    "CacheConfig": "tandem.engine.config",
    "EngineConfig": "tandem.engine.config",
    "ModelConfig": "tandem.engine.config",
    "SchedulerConfig": "tandem.engine.config",
    "EngineError": "tandem.engine.errors",
    "InvalidRequestError": "tandem.engine.errors",
    "ModelLoadError": "tandem.engine.errors",
    "OutOfBlocksError": "tandem.engine.errors",
    "UnknownRequestError": "tandem.engine.errors",
    "EngineStats": "tandem.engine.outputs",
    "KVCacheSpec": "tandem.engine.outputs",
    "RequestOutput": "tandem.engine.outputs",
    "TokenLogprob": "tandem.engine.outputs",
    "SamplingParams": "tandem.engine.sampling_params",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
