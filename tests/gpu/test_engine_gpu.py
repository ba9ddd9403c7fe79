"""The engine on a CUDA device: Triton attention, CUDA-graph decode, bf16 (tiny models).

Skipped without CUDA. Run by scripts/gpu_check.sh on a lent GPU machine (no Ray there).
"""

from __future__ import annotations

import pytest
import torch

from tandem.engine import SamplingParams
from tests.unit.engine._handoff import copy_blocks
from tests.unit.engine._reference import engine_token_ids, hf_greedy

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


def _prompts(lengths: list[int], vocab: int = 256) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def _run(engine, prompts, params=GREEDY) -> list[list[int]]:
    return engine_token_ids(engine, prompts, params)


def test_cuda_fp32_triton_graphs_match_transformers(tiny_dir, make_engine) -> None:
    path = tiny_dir("llama", 2)
    engine = make_engine(
        model=str(path), device="cuda", dtype="float32", attention_backend="triton",
        num_blocks=256, max_num_seqs=8,
    )
    assert engine.runner.graphs is not None
    prompts = _prompts([5, 17, 40, 100, 3])
    for prompt, tokens in zip(prompts, _run(engine, prompts), strict=True):
        assert tokens == hf_greedy(path, prompt, GREEDY.max_tokens)


def test_cuda_graphs_equal_eager_in_bf16(tiny_dir, make_engine) -> None:
    path = tiny_dir("qwen2", 2)
    common = dict(model=str(path), device="cuda", dtype="bfloat16", num_blocks=256,
                  max_num_seqs=16, attention_backend="triton")
    graphs = make_engine(**common)
    eager = make_engine(**common, use_cuda_graphs=False)
    prompts = _prompts([9, 33, 64, 7, 120, 2, 50])
    assert _run(graphs, prompts) == _run(eager, prompts)


def test_cuda_triton_equals_torch_backend_fp32(tiny_dir, make_engine) -> None:
    path = tiny_dir("qwen3", 1)
    kw = dict(model=str(path), device="cuda", dtype="float32", num_blocks=256,
              max_num_batched_tokens=32)
    tri = make_engine(**kw, attention_backend="triton")
    ref = make_engine(**kw, attention_backend="torch")
    prompts = _prompts([70, 12, 5, 90])
    assert _run(tri, prompts) == _run(ref, prompts)


def test_cuda_sampling_seeded_and_handoff(tiny_dir, make_engine) -> None:
    path = tiny_dir("llama", 2)
    kw = dict(model=str(path), device="cuda", dtype="bfloat16", num_blocks=128)
    prefill, decode = make_engine(**kw), make_engine(**kw)
    p = SamplingParams(temperature=0.9, top_p=0.9, seed=3, max_tokens=12, ignore_eos=True)
    prompt = _prompts([33])[0]
    assert _run(prefill, [prompt], p) == _run(prefill, _prompts([4, 8]) + [prompt], p)[-1:]
    expected = _run(prefill, [prompt])[0]
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    rid = prefill.remote.prefill.add(prompt, one, request_id="h")
    first = None
    while prefill.has_unfinished():
        for out in prefill.step():
            first = out.token_ids[0]
    src = prefill.remote.prefill.held_block_ids(rid)
    dst = decode.remote.decode.reserve("h", prompt, GREEDY).fill_block_ids
    copy_blocks(prefill, src, decode, dst)
    prefill.remote.prefill.release(rid)
    tokens = list(decode.remote.decode.commit("h", first).new_token_ids)
    while decode.has_unfinished():
        for out in decode.step():
            tokens += out.new_token_ids
    assert tokens == expected


def test_cuda_layer_hook_hands_a_device_event(tiny_dir, make_engine) -> None:
    """On CUDA the prefill role's layer hook gets a pending handle per layer (the layer's
    kernels are only queued when it fires); waiting on each returns once they have run."""
    engine = make_engine(model=str(tiny_dir("llama", 2)), device="cuda", dtype="float32",
                         num_blocks=64)
    handles = []
    engine.remote.prefill.set_layer_hook(
        lambda layer, done, ready: handles.append((layer, [rid for rid, _ in done], ready)))
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    rid = engine.remote.prefill.add(_prompts([40])[0], one, request_id="h")
    while engine.has_unfinished():
        engine.step()
    engine.remote.prefill.set_layer_hook(None)
    assert [(layer, ids) for layer, ids, _ in handles] == [
        (layer, ["h"]) for layer in range(engine.arch.num_layers)]
    assert all(ready.pending for _, _, ready in handles)
    for _, _, ready in handles:
        ready.wait()
    assert engine.remote.prefill.release(rid)


def test_cuda_fork_copies_the_shared_block_on_the_device(tiny_dir, make_engine) -> None:
    """A forked request on Triton attention + CUDA-graph decode: the partial prompt block is
    copied on write in the device cache; each sequence equals its seeded single request."""
    from dataclasses import replace

    engine = make_engine(model=str(tiny_dir("llama", 2)), device="cuda", dtype="float32",
                         attention_backend="triton", num_blocks=256, max_num_seqs=8)
    prompt = _prompts([21])[0]  # one full block of 16 and a partial one
    p = SamplingParams(temperature=1.0, top_k=20, seed=3, max_tokens=16, ignore_eos=True)
    singles = [_run(engine, [prompt], replace(p, seed=3 + j))[0] for j in range(4)]
    engine.add_request(prompt, p, request_id="f", n=4)
    got: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            got.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert [got["f"]] + [got[f"f#{j}"] for j in range(1, 4)] == singles


def test_gpu_memory_utilization_sizes_the_kv_pool_from_what_the_device_has_left(
        tiny_dir, make_engine) -> None:
    """vLLM's --gpu-memory-utilization: the pool is what the share leaves after the weights,
    everything else on the device and the activation reserve; it serves, and a share too small
    for one block is refused naming the figures."""
    from tandem.engine.kv_budget import activation_reserve

    path = tiny_dir("llama", 2)
    total = torch.cuda.mem_get_info()[1]
    engine = make_engine(model=str(path), device="cuda", dtype="bfloat16",
                         gpu_memory_utilization=0.1, max_num_seqs=8)
    per_block = engine.runner.kv_bytes_per_block(engine.arch, engine.config.cache.block_size,
                                                 engine.dtype, "auto")
    blocks = engine.kv.pool.num_blocks
    reserve = activation_reserve(engine.arch, engine.config.scheduler.max_num_batched_tokens,
                                 8, 2)
    assert blocks * per_block <= 0.1 * total - reserve
    assert blocks * per_block >= 0.05 * total  # a tiny model's weights leave most of the share
    prompts = _prompts([5, 40])
    assert all(len(t) == GREEDY.max_tokens for t in _run(engine, prompts))
    with pytest.raises(ValueError, match="leaves no room for the KV cache"):
        make_engine(model=str(path), device="cuda", dtype="bfloat16",
                    gpu_memory_utilization=1e-4)


def test_cuda_sliding_window_mistral_matches_transformers(tmp_path, make_engine) -> None:
    """Mistral, window 12 < the prompts, fp32: Triton prefill and CUDA-graph decode equal
    transformers while the blocks behind the window are freed and handed out again."""
    from tests.unit.engine._perturbed import perturbed_checkpoint

    path = perturbed_checkpoint(tmp_path / "mistral", "mistral", sliding_window=12)
    engine = make_engine(model=str(path), device="cuda", dtype="float32",
                         attention_backend="triton", num_blocks=64, block_size=4,
                         max_num_seqs=8, max_num_batched_tokens=16)
    assert engine.runner.graphs is not None and engine.kv.sliding_window == 12
    prompts = _prompts([5, 17, 40, 70, 3])
    for prompt, tokens in zip(prompts, _run(engine, prompts), strict=True):
        assert tokens == hf_greedy(path, prompt, GREEDY.max_tokens)


def test_cuda_fp8_kv_triton_equals_torch_and_hands_off(tiny_dir, make_engine) -> None:
    """fp8 KV on the device (tandem/engine/quant/kv_fp8.py): the Triton kernels over the
    dequantized blocks give the torch backend's tokens, no CUDA graphs are captured, and a
    handoff of fp8 blocks (staged through the host as bytes) continues the same tokens."""
    path = tiny_dir("llama", 2)
    kw = dict(model=str(path), device="cuda", dtype="float32", num_blocks=128,
              kv_cache_dtype="fp8")
    tri = make_engine(**kw, attention_backend="triton")
    assert tri.runner.kv_cache.dtype == torch.float8_e4m3fn and tri.runner.graphs is None
    ref = make_engine(**kw, attention_backend="torch")
    prompts = _prompts([40, 7, 90])
    want = _run(ref, prompts)
    assert _run(tri, prompts) == want
    prefill, decode = make_engine(**kw, attention_backend="triton"), tri
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    rid = prefill.remote.prefill.add(prompts[0], one, request_id="f")
    first = None
    while prefill.has_unfinished():
        for out in prefill.step():
            first = out.token_ids[0]
    dst = decode.remote.decode.reserve("f", prompts[0], GREEDY).fill_block_ids
    copy_blocks(prefill, prefill.remote.prefill.held_block_ids(rid), decode, dst)
    prefill.remote.prefill.release(rid)
    tokens = list(decode.remote.decode.commit("f", first).new_token_ids)
    while decode.has_unfinished():
        for out in decode.step():
            tokens += out.new_token_ids
    assert tokens == want[0]
