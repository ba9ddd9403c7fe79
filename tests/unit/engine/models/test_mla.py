"""Multi-head latent attention (DeepSeek-V2/V3) against transformers, fp32, greedy, token for
token, over the latent KV cache: V2-style (q straight from the hidden state) and V3-style
(q-LoRA) tiny checkpoints whose every layer is dense and every parameter non-trivial
(tandem/engine/testing/perturb.py); prompts of several blocks, whole and chunked prefill,
prefix-cache hits, and a P/D handoff of the latent blocks; on the torch path (the fused
native one: tests/unit/engine/native/test_fused_deepseek.py). With DeepSeek's MoE layers:
test_deepseek_moe.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tandem.engine import SamplingParams
from tandem.engine.models.weights import read_arch
from tandem.worker.convert import kv_layout
from tests.unit.engine._handoff import handoff_token_ids
from tests.unit.engine._reference import engine_token_ids, hf_greedy

BLOCK = 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
        "mscale": 1.0, "mscale_all_dim": 0.8, "beta_fast": 32, "beta_slow": 1}
# name -> (arch, make_tiny_checkpoint options)
CASES = {
    "v2": ("deepseek_v2", {}),
    "v2-biases": ("deepseek_v2", {"attention_bias": True, "mlp_bias": True}),
    "v3-q-lora": ("deepseek_v3", {}),
    "v3-attention-bias": ("deepseek_v3", {"attention_bias": True}),
    "v3-rope-halves": ("deepseek_v3", {"rope_interleave": False}),
    # yarn's mscale_all_dim changes the softmax scale; prompts cross the original context
    "v3-yarn": ("deepseek_v3", {"rope_scaling": YARN}),
}


def _prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 256, (n,), generator=g).tolist() for n in lengths]


def _engine(make_engine, path: Path, **kw):
    """The torch path's engine (the fused native one: tests/unit/engine/native/
    test_fused_deepseek.py)."""
    return make_engine(model=str(path), block_size=BLOCK,
                       **{"num_blocks": 128, "use_native_kernels": False, **kw})


@pytest.mark.parametrize("budget", [None, 8], ids=["whole", "chunked"])
@pytest.mark.parametrize("case", list(CASES))
def test_greedy_equals_transformers(family_dir, make_engine, case: str,
                                    budget: int | None) -> None:
    arch, options = CASES[case]
    path = family_dir(arch, **options)
    extra = {} if budget is None else {"max_num_batched_tokens": budget}
    engine = _engine(make_engine, path, **extra)
    mla = engine.arch.mla
    assert mla is not None and engine.runner.fused is None
    # the latent cache: one plane, one head of kv_lora_rank + rope values per token
    assert engine.runner.kv_cache.shape[1:] == (1, 128, BLOCK, 1, 32 + 8)
    prompts = _prompts([3, 9, 30, 75], seed=1)
    got = engine_token_ids(engine, prompts, GREEDY)
    for prompt, tokens in zip(prompts, got, strict=True):
        assert tokens == hf_greedy(path, prompt, GREEDY.max_tokens), case


def test_the_yarn_softmax_scale_is_transformers(family_dir) -> None:
    from transformers import AutoModelForCausalLM

    path = family_dir("deepseek_v3", rope_scaling=YARN)
    _, arch = read_arch(path)
    hf = AutoModelForCausalLM.from_pretrained(path)
    assert arch.mla is not None
    assert arch.mla.softmax_scale == pytest.approx(hf.model.layers[0].self_attn.scaling,
                                                   rel=1e-12)
    assert arch.mla.softmax_scale != pytest.approx(arch.mla.qk_head_dim**-0.5)


def test_prefix_cache_hits_on_latent_blocks(family_dir, make_engine) -> None:
    path = family_dir("deepseek_v3")
    engine = _engine(make_engine, path)
    shared = _prompts([24], seed=2)[0]
    first = engine_token_ids(engine, [shared + [5, 6]], GREEDY)[0]
    hits = engine.stats().prefix_cache_hits
    second = engine_token_ids(engine, [shared + [9, 10, 11]], GREEDY)[0]
    assert engine.stats().prefix_cache_hits - hits == 24
    assert first == hf_greedy(path, shared + [5, 6], GREEDY.max_tokens)
    assert second == hf_greedy(path, shared + [9, 10, 11], GREEDY.max_tokens)


@pytest.mark.parametrize("arch", ["deepseek_v2", "deepseek_v3"])
def test_absorbed_decode_equals_the_decompressed_path(family_dir, make_engine,
                                                      arch: str) -> None:
    """The same requests with every decode row attending in latent space (absorbed) and with
    every row decompressed: equal logprobs at every generated token."""
    path = family_dir(arch)
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=3)
    prompts = _prompts([6, 21], seed=3)
    runs = []
    for absorb in (True, False):
        engine = _engine(make_engine, path)
        for layer in engine.runner.model.layers:
            layer.self_attn.absorb = absorb
        ids = [engine.add_request(p, params) for p in prompts]
        outs: dict[str, list] = {i: [] for i in ids}
        while engine.has_unfinished():
            for out in engine.step():
                outs[out.request_id] += out.logprobs or []
        runs.append([outs[i] for i in ids])
    for absorbed, decompressed in zip(*runs, strict=True):
        assert len(absorbed) == len(decompressed) == 10
        for a, d in zip(absorbed, decompressed, strict=True):
            assert a.token_id == d.token_id
            assert a.logprob == pytest.approx(d.logprob, abs=1e-4)
            assert [t for t, _ in a.top] == [t for t, _ in d.top]
            assert [lp for _, lp in a.top] == pytest.approx([lp for _, lp in d.top], abs=1e-4)


@pytest.mark.parametrize("arch", ["deepseek_v2", "deepseek_v3"])
def test_handoff_equals_colocated(family_dir, make_engine, arch: str) -> None:
    """Prefill on P, its latent blocks shipped through kv_transfer's block access (the
    layouts' fingerprints checked first), decode on D: transformers' tokens."""
    path = family_dir(arch)
    prefill = _engine(make_engine, path, num_blocks=64)
    decode = _engine(make_engine, path, num_blocks=64)
    layout = kv_layout(prefill.remote.kv_cache_spec())
    assert (layout.planes, layout.num_kv_heads, layout.head_dim, layout.kv_lora_rank) == \
        (1, 1, 40, 32)
    prompt = _prompts([37], seed=6)[0]
    tokens = handoff_token_ids(prefill, decode, prompt, GREEDY)
    assert tokens == hf_greedy(path, prompt, GREEDY.max_tokens)


def test_kv_bytes_per_token_are_the_latents(family_dir, make_engine) -> None:
    """Block bytes, the pool's size and the transfer layout count one latent row per token and
    layer: (kv_lora_rank + rope) x itemsize, not 2 x heads x head_dim."""
    from tandem.engine.model_runner import ModelRunner

    engine = _engine(make_engine, family_dir("deepseek_v3"))
    arch = engine.arch
    per_block = ModelRunner.kv_bytes_per_block(arch, BLOCK, torch.float32)
    assert per_block == arch.num_layers * BLOCK * (32 + 8) * 4
    assert per_block * 128 == engine.runner.kv_cache.numel() * 4
    layout = kv_layout(engine.remote.kv_cache_spec())
    assert layout.payload_bytes(arch.num_layers, 1) == per_block


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_a_quantized_kv_cache_is_refused(family_dir, make_engine, kv: str) -> None:
    with pytest.raises(ValueError, match=f"{kv} is not supported for multi-head latent"):
        _engine(make_engine, family_dir("deepseek_v3"), kv_cache_dtype=kv)


@pytest.mark.parametrize("arch", ["llama", "qwen3_moe", "deepseek_v2", "deepseek_v3"])
def test_the_planner_sizes_the_cache_the_engine_allocates(family_dir, arch: str) -> None:
    """`tandem plan` reads the same config.json into the cache shape the engine's pool is
    built of (tandem/common/kv_cache_shape.py): MLA's latent row, GQA's K and V heads."""
    import json

    from tandem.engine.model_runner import ModelRunner
    from tandem.planner.models import from_hf_config

    path = family_dir(arch)
    _, engine_arch = read_arch(path)
    shape = from_hf_config(json.loads((path / "config.json").read_text()))
    assert shape.kv_cache == engine_arch.kv_shape
    assert shape.kv_cache.latent == (engine_arch.mla is not None)
    per_block = ModelRunner.kv_bytes_per_block(engine_arch, BLOCK, torch.bfloat16, "auto")
    assert shape.kv_bytes_per_token("bf16") * BLOCK == per_block
