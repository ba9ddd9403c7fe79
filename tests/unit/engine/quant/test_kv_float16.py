"""The float16 KV cache: the default for a float32 model on the CPU's native path (half the
bytes a decode step reads), chosen explicitly elsewhere; close to the float32 cache on both
the native and the torch-ops paths, and shipped as float16 blocks in the handoff."""

from __future__ import annotations

import pytest
import torch

from bench.quality.perplexity import token_nlls
from tandem.engine import EngineConfig, SamplingParams
from tandem.engine.model_runner import ModelRunner
from tandem.engine.native import load
from tandem.worker.convert import kv_layout
from tests.unit.engine._handoff import copy_blocks

PROMPT = [3 + (i * 37) % 250 for i in range(45)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def _run(engine, prompt=PROMPT) -> list[int]:
    rid = engine.add_request(prompt, GREEDY)
    out: list[int] = []
    while engine.has_unfinished():
        out += [t for o in engine.step() if o.request_id == rid for t in o.new_token_ids]
    return out


@pytest.mark.parametrize(("kwargs", "resolved"), [
    ({}, "float16"),                                   # float32 model, CPU, native path
    ({"use_native_kernels": False}, "float32"),        # torch ops: the model dtype
    ({"dtype": "bfloat16"}, "bfloat16"),
    ({"dtype": "float16"}, "float16"),
    ({"device": "cuda"}, "bfloat16"),                  # bf16 on CUDA
    ({"device": "cuda", "dtype": "float32"}, "float32"),
    ({"kv_cache_dtype": "float32"}, "float32"),
    ({"kv_cache_dtype": "int8"}, "int8"),
    ({"kv_cache_dtype": "bfloat16", "use_native_kernels": False}, "bfloat16"),
    ({"device": "cuda", "kv_cache_dtype": "int8"}, "int8"),
])
def test_auto_is_float16_only_where_the_native_cpu_path_reads_it(kwargs, resolved) -> None:
    assert EngineConfig.from_kwargs(**kwargs).resolved_kv_cache_dtype() == resolved


def test_without_native_kernels_auto_keeps_the_model_dtype() -> None:
    """The engine passes whether the kernels loaded: no compiler, no float16 default."""
    config = EngineConfig.from_kwargs()
    assert config.resolved_kv_cache_dtype(native=False) == "float32"
    assert config.resolved_kv_cache_dtype(native=True) == "float16"


def test_unknown_or_mismatched_kv_dtypes_are_refused() -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        EngineConfig.from_kwargs(kv_cache_dtype="fp4")
    # the Triton kernels read the model dtype's cache (or int8/fp8 through a wrapper)
    with pytest.raises(ValueError, match="on CUDA the KV cache holds the model dtype"):
        EngineConfig.from_kwargs(device="cuda", kv_cache_dtype="float16")


def test_a_float16_block_is_half_a_float32_block(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=8, kv_cache_dtype="float16")
    arch = engine.arch
    assert engine.runner.kv_cache.dtype == torch.float16
    f16 = ModelRunner.kv_bytes_per_block(arch, 16, torch.float32, "float16")
    assert 2 * f16 == ModelRunner.kv_bytes_per_block(arch, 16, torch.float32, "float32")
    assert f16 == arch.num_layers * 2 * 16 * arch.num_kv_heads * arch.head_dim * 2
    ref = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=8)  # float32 (conftest)
    assert engine.remote.kv_cache_spec().kv_dtype == "float16"
    assert kv_layout(ref.remote.kv_cache_spec()).fingerprint != \
        kv_layout(engine.remote.kv_cache_spec()).fingerprint


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize(("arch", "kv_heads"), [("llama", 2), ("qwen2", 1)])
def test_float16_kv_tracks_the_float32_cache(make_engine, tiny_dir, native: bool, arch: str,
                                             kv_heads: int) -> None:
    """Both paths: the fused native forward reads float16 K/V itself; torch ops widen the
    gathered blocks to the model dtype before attending."""
    if native and load() is None:
        pytest.skip("no native kernels")
    model = str(tiny_dir(arch, kv_heads))
    common = dict(model=model, num_blocks=64, block_size=16, use_native_kernels=native)
    ref = make_engine(**common, kv_cache_dtype="float32")
    f16 = make_engine(**common, kv_cache_dtype="float16")
    assert (f16.runner.fused is not None) == native
    ids = PROMPT * 2
    a = token_nlls(ref.runner, ids, chunk=32, fused=native)
    b = token_nlls(f16.runner, ids, chunk=32, fused=native)
    # float16 keeps ~3 significant digits: the log-likelihoods move, by far less than int8's
    assert 0 < (a - b).abs().max() < 2e-3, (a - b).abs().max()
    got, want = _run(f16), _run(ref)
    assert got[:6] == want[:6]


def test_handoff_ships_float16_blocks(make_engine, tiny_dir) -> None:
    """Prefill on one default engine, copy its blocks into another (the transfer layer's
    job), continue there: the same tokens as one engine."""
    model = str(tiny_dir("llama", 2))
    kw = dict(model=model, num_blocks=32, block_size=16, kv_cache_dtype="float16")
    want = _run(make_engine(**kw))
    pre, dec = make_engine(**kw), make_engine(**kw)
    rid = pre.remote.prefill.add(PROMPT, SamplingParams(temperature=0.0, max_tokens=1))
    first: list[int] = []
    while pre.has_unfinished():
        first += [t for o in pre.step() for t in o.new_token_ids]
    dst = dec.remote.decode.reserve("r", PROMPT, GREEDY).fill_block_ids
    copy_blocks(pre, pre.remote.prefill.held_block_ids(rid), dec, dst)
    pre.remote.prefill.release(rid)
    got = list(dec.remote.decode.commit("r", first[0]).new_token_ids)
    while dec.has_unfinished():
        got += [t for o in dec.step() for t in o.new_token_ids]
    assert got == want
