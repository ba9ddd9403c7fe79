"""Shared fixtures: tiny checkpoints, the SmolLM2 engine, and the KV-leak assertion.

Every engine a test builds through ``make_engine`` is checked after *every* test: all of its
blocks must be back in the free pool (nothing running, waiting, held or reserved).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

_ENGINES: list[Any] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip GPU-marked tests on machines without CUDA (never report them as passing)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def assert_no_leaks(engine: Any) -> None:
    """Every block of ``engine`` is free: no request holds, reserves or leaks one."""
    stats = engine.stats()
    assert stats.num_running == 0 and stats.num_waiting == 0, stats
    assert stats.num_waiting_for_remote_kv == 0 and stats.num_held == 0, stats
    assert engine.kv.pool.num_referenced() == 0, "KV blocks leaked"
    assert stats.num_free_blocks == stats.num_blocks, stats


@pytest.fixture(autouse=True)
def _no_block_leaks() -> Iterator[None]:
    yield
    for engine in _ENGINES:
        assert_no_leaks(engine)


def reference_kv(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with the float32 KV cache where the engine's default would be float16 (a
    float32 model on the CPU's native path: tandem/engine/config.py resolved_kv_cache_dtype) and
    the caller named none: tests of the engine's math hold it to transformers' float32
    attention exactly. Name ``kv_cache_dtype`` (``"auto"`` included) to get another."""
    from tandem.engine import EngineConfig

    if "kv_cache_dtype" in kwargs:
        return kwargs
    if EngineConfig.from_kwargs(**kwargs).resolved_kv_cache_dtype() != "float16":
        return kwargs
    return {**kwargs, "kv_cache_dtype": "float32"}


@pytest.fixture(scope="session")
def make_engine() -> Callable[..., Any]:
    """Build an ``LLMEngine`` from flat options (``reference_kv``: the float32 KV cache unless
    the test names one); it is leak-checked after every test."""
    from tandem.engine import EngineConfig, LLMEngine

    def build(**kwargs: Any) -> Any:
        engine = LLMEngine(EngineConfig.from_kwargs(**reference_kv(kwargs)), progress=False)
        _ENGINES.append(engine)
        return engine

    return build


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Tiny random checkpoints by (arch, kv heads), written once per session."""
    from tandem.engine.testing import make_tiny_checkpoint

    made: dict[tuple[Any, ...], Path] = {}

    def get(arch: str = "llama", num_kv_heads: int = 2, **kw: Any) -> Path:
        key = (arch, num_kv_heads, tuple(sorted(kw.items())))
        if key not in made:
            path = tmp_path_factory.mktemp(f"tiny-{arch}-{num_kv_heads}")
            made[key] = make_tiny_checkpoint(path, arch=arch, num_kv_heads=num_kv_heads, **kw)
        return made[key]

    return get


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct converted to safetensors (cached under ~/.cache/tandem)."""
    from tandem.engine.loader import resolve_model

    return resolve_model("smollm2")
