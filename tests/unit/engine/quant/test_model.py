"""Quantized SmolLM2 loads, generates, and keeps its perplexity within the bounds that
bench/quality/perplexity.py established (docs/bench/quantization.md): int8 within 1% of bf16, int4
taken straight from the GGUF's Q4_1 blocks within 0.5% of the dequantized fp32 model, and the
default (``auto``: the GGUF's Q4_1 and Q8_0 blocks as stored, embedding included) the same,
and with its float16 KV cache within 0.05% of the float32 cache.

Perplexity here runs over the first 512 tokens of tests/data/ppl_text.txt (the benchmark uses
all ~2,500), in 128-token chunks, so the paged multi-chunk path is part of it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.quality.perplexity import perplexity
from tandem.engine import SamplingParams
from tandem.engine.loader import _alias_path
from tandem.engine.native import load
from tandem.engine.native.packed_linear import PackedEmbedding, PackedLinear
from tandem.engine.quant import Int4Linear, Int8Linear
from tests.unit.engine._reference import engine_token_ids

TEXT = Path(__file__).resolve().parents[3] / "data" / "ppl_text.txt"
ROWS = {
    "fp32": {"dtype": "float32", "quantization": "none"},
    "bf16": {"dtype": "bfloat16", "quantization": "none"},
    "auto": {"dtype": "float32"},
    "int8": {"dtype": "float32", "quantization": "int8"},
    "int4": {"dtype": "float32", "quantization": "int4"},
    # what LLM("smollm2") runs: "auto" and the float16 KV cache (the others: float32 KV,
    # tests/conftest.py reference_kv)
    "default": {"kv_cache_dtype": "auto"},
}


@pytest.fixture(scope="module")
def engines(make_engine, smollm2_dir) -> dict:
    # "smollm2" (the alias) so the int4 engine finds the GGUF and reads its Q4_1 blocks.
    return {k: make_engine(model="smollm2", num_blocks=64, **v) for k, v in ROWS.items()}


@pytest.fixture(scope="module")
def ppl(engines) -> dict[str, float]:
    ids = engines["fp32"].tokenizer.encode(TEXT.read_text())[:512]
    return {k: perplexity(e.runner, ids, chunk=128) for k, e in engines.items()}


def test_layers_are_swapped(engines) -> None:
    m4, m8 = engines["int4"].runner.model, engines["int8"].runner.model
    if load() is None:  # torch's kernels
        assert all(isinstance(layer.mlp.down_proj, Int4Linear) for layer in m4.layers)
        assert isinstance(m4.lm_head, Int8Linear) and isinstance(m8.lm_head, Int8Linear)
        assert all(isinstance(layer.self_attn.qkv_proj, Int8Linear) for layer in m8.layers)
        return
    assert all(layer.mlp.down_proj.format == "Q4_1" for layer in m4.layers)
    assert m4.lm_head.format == m8.lm_head.format == "int8 (per row)"
    assert all(layer.self_attn.qkv_proj.format == "int8 (per row)" for layer in m8.layers)


def test_auto_keeps_the_gguf_blocks(engines) -> None:
    """The default reads the file's own formats: Q4_1 linears, the Q8_0 embedding shared with
    the tied lm_head; the weights it holds stay within 1.2x the file's size."""
    engine = engines["auto"]
    if load() is None:
        pytest.skip("no native kernels: auto keeps the Q4_1 linears only")
    model = engine.runner.model
    assert engine.weights_format == "Q4_1 x120 + Q8_0 (embedding, lm_head) x1"
    assert isinstance(model.embed_tokens, PackedEmbedding)
    assert model.lm_head is model.embed_tokens.table and model.lm_head.format == "Q8_0"
    assert all(isinstance(layer.mlp.gate_up_proj, PackedLinear) for layer in model.layers)
    assert engine.weight_bytes <= 1.2 * _alias_path("smollm2").stat().st_size


def test_auto_weights_are_the_dequantized_model(engines) -> None:
    """Bit for bit in fp32 what transformers' dequantization of the same file holds, the
    embedding table too."""
    if load() is None:
        pytest.skip("no native kernels")
    ref, auto = engines["fp32"].runner.model, engines["auto"].runner.model
    ids = torch.tensor([0, 1, 17, 4096, 49151])
    assert torch.equal(auto.embed_tokens(ids), ref.embed_tokens(ids))
    assert torch.equal(auto.lm_head.dequantize(), ref.embed_tokens.weight)
    for i in (0, 29):
        for name in ("self_attn.qkv_proj", "mlp.down_proj"):
            w = ref.layers[i].get_submodule(name).weight
            assert torch.equal(auto.layers[i].get_submodule(name).dequantize(), w), (i, name)


def test_int4_from_q4_1_is_the_dequantized_model(engines) -> None:
    """Same weights, bit for bit in fp32, as transformers' dequantization of the same file."""
    ref, q4 = engines["fp32"].runner.model, engines["int4"].runner.model
    for i in (0, 17, 29):
        for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj",
                     "mlp.down_proj"):
            w = ref.layers[i].get_submodule(name).weight
            assert torch.equal(q4.layers[i].get_submodule(name).dequantize(), w), (i, name)


def test_perplexity_within_the_established_bounds(ppl) -> None:
    assert 15 < ppl["fp32"] < 40, ppl  # a sane model on plain English prose
    assert abs(ppl["int8"] / ppl["bf16"] - 1) < 0.01, ppl
    assert abs(ppl["int4"] / ppl["fp32"] - 1) < 0.005, ppl
    assert abs(ppl["auto"] / ppl["fp32"] - 1) < 0.005, ppl


@pytest.mark.parametrize("row", ["int8", "int4", "auto"])
def test_quantized_model_generates(engines, row: str) -> None:
    engine = engines[row]
    rid = engine.add_request("The capital of France is",
                             SamplingParams(temperature=0.0, max_tokens=8))
    text = ""
    while engine.has_unfinished():
        text += "".join(o.new_text for o in engine.step() if o.request_id == rid)
    assert "Paris" in text, text
    st = engine.stats()
    assert st.num_free_blocks == st.num_blocks


PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "def fibonacci(n):",
]


def _greedy(engine, prompts: list[str], max_tokens: int = 24) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return engine_token_ids(engine, prompts, params)


def test_int4_native_decode_equals_the_dequantized_model(engines) -> None:
    """The fused native forward (int16 activations) decodes the Q4_1 weights as the fp32
    engine decodes their dequantization (which equals transformers' generate())."""
    assert engines["int4"].runner.fused is not None
    assert _greedy(engines["int4"], PROMPTS) == _greedy(engines["fp32"], PROMPTS)


def test_int4_native_perplexity_equals_the_dequantized_model(engines, ppl) -> None:
    ids = engines["fp32"].tokenizer.encode(TEXT.read_text())[:512]
    native = perplexity(engines["int4"].runner, ids, chunk=16, fused=True)
    assert abs(native / ppl["fp32"] - 1) < 0.001, (native, ppl)


def test_the_default_float16_cache_keeps_the_float32_cache_s_text(engines, ppl) -> None:
    """The default engine stores K and V in float16 (half the bytes each decode step reads)
    and keeps the float32 cache's perplexity within 0.05% (bench/quality/perplexity.py on the full
    text: +0.004%) and its greedy text."""
    default, ref = engines["default"], engines["auto"]
    if default.runner.fused is None:
        pytest.skip("no native kernels: the cache stays float32")
    assert default.runner.kv_cache.dtype == torch.float16 and ref.runner.kv_cache.dtype == torch.float32
    assert default.remote.kv_cache_spec().kv_dtype == "float16"
    ids = ref.tokenizer.encode(TEXT.read_text())[:512]
    native = perplexity(default.runner, ids, chunk=128, fused=True)
    assert abs(native / ppl["auto"] - 1) < 0.0005, (native, ppl["auto"])
    assert _greedy(default, PROMPTS) == _greedy(ref, PROMPTS)


def test_int4_ngram_speculation_equals_plain(make_engine, engines) -> None:
    """Quantization x speculation: verification rows through the fused forward accept
    exactly the tokens plain int4 decoding produces."""
    spec = make_engine(model="smollm2", num_blocks=64, dtype="float32", quantization="int4",
                       speculative_method="ngram", num_speculative_tokens=4)
    prompts = [*PROMPTS, "Repeat exactly: one two three four five six seven eight nine ten"]
    assert _greedy(spec, prompts, 32) == _greedy(engines["int4"], prompts, 32)
    assert spec.stats().spec_accepted_tokens > 0
