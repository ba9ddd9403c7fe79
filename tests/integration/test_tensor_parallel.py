"""Tensor parallelism (tandem/engine/parallel): an engine whose model is split over 2 or 3 rank
processes (gloo on loopback) generates exactly transformers' greedy tokens, on tiny perturbed
checkpoints with fewer KV heads than ranks (replicated) and with KV heads split, on mixture-
of-experts ones (every expert split across the ranks), on latent-attention ones (DeepSeek-V2/V3:
query heads split, the latent cache whole on every rank; a DeepSeek GGUF's blocks cut by
heads), on mixture-of-experts ones with expert parallelism (Mixtral, Qwen3-MoE, DeepSeek-V2 at
2 and 3 ranks: whole experts per rank, 3/3/2 of 8 over 3; a Mixtral GGUF's expert blocks),
and on the default model (SmolLM2's Q4_1 GGUF: 9 heads, 3 KV heads) over 3 ranks; a
pre-quantized checkpoint (AWQ, GPTQ, compressed-tensors) split on its groups generates exactly
what one rank does, and so does a group speculating with a draft checkpoint run whole on rank
0. Every KV block is back in the pool afterwards: one scheduler (rank 0's)
allocates for every rank, whose caches hold their own heads at the same block ids. Closing the
engine ends every rank."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from tandem.engine import EngineConfig, LLMEngine, SamplingParams
from tandem.engine.core.request import sequence_id
from tandem.engine.testing.prequantized import QuantSpec, write_prequantized
from tests.conftest import assert_no_leaks
from tests.unit.engine._reference import engine_token_ids, hf_greedy

MAX_NEW = 12


def _prompts() -> list[list[int]]:
    long = [(7 * i + 3) % 250 + 3 for i in range(70)]  # several blocks, chunked below
    return [[5, 9, 33, 7, 100, 3], long, long[:40] + [11, 12], [200, 1, 4, 6, 9, 10, 11]]


def _run_group(path: Path, tp: int, want: list[list[int]] | None = None,
               **extra: object) -> None:
    """The group's greedy tokens for _prompts() are ``want`` (None: transformers')."""
    engine = LLMEngine(EngineConfig.from_kwargs(
        model=str(path), num_blocks=64, block_size=16, max_num_batched_tokens=32,
        tensor_parallel_size=tp, num_threads=1, **extra), progress=False)
    followers = [f.proc for f in engine.group._followers]  # type: ignore[union-attr]
    try:
        params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)
        prompts = _prompts()
        got = engine_token_ids(engine, prompts, params)
        assert got == (want or [hf_greedy(path, p, MAX_NEW) for p in prompts])
        # two sequences sharing the prompt's blocks: their copy-on-write runs on every rank
        engine.add_request(prompts[0], params, request_id="forked", n=2)
        outs: dict[str, list[int]] = {}
        while engine.has_unfinished():
            for out in engine.step():
                outs.setdefault(out.request_id, []).extend(out.new_token_ids)
        assert [outs[sequence_id("forked", j)] for j in range(2)] == [got[0]] * 2
        assert_no_leaks(engine)
    finally:
        engine.close()
    assert [p.wait(timeout=60) for p in followers] == [0] * (tp - 1)


@pytest.mark.parametrize("tp", [2, 3])
def test_fewer_kv_heads_than_ranks_equals_transformers(tiny_dir, tp: int) -> None:
    """6 heads, 1 KV head (replicated on every rank), biases on q/k/v/o and the MLP."""
    path = tiny_dir("llama", 1, num_heads=6, hidden_size=96, attention_bias=True,
                    mlp_bias=True)
    _run_group(path, tp)


def test_kv_heads_split_over_three_ranks_equals_transformers(tiny_dir) -> None:
    """Qwen2 (q/k/v biases), 6 heads and 3 KV heads: one KV head on each rank."""
    _run_group(tiny_dir("qwen2", 3, num_heads=6, hidden_size=96), 3)


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe"])
def test_moe_over_two_ranks_equals_transformers(tiny_dir, arch: str) -> None:
    """Each rank holds every expert's half, the router whole, one all-reduce per MoE layer.
    Qwen2-MoE: a shared expert behind its sigmoid gate, q/k/v biases, layers 0 and 2
    dense."""
    extra = {"num_layers": 3, "decoder_sparse_step": 2} if arch == "qwen2_moe" else {}
    _run_group(tiny_dir(arch, 2, **extra), 2)


# expert widths 3 does not divide (100, 40, 40; transformers' grouped matmuls want widths of
# whole 16-byte rows): only whole experts per rank serve them over 3 ranks
_EP_MODELS = {
    "mixtral": dict(intermediate_size=100),
    "qwen3_moe": dict(moe_intermediate_size=40),
    # layer 0 dense (192 wide, split); 3 shared experts of 40: 120, split over 2 or 3
    "deepseek_v2": dict(num_layers=3, first_k_dense_replace=1, moe_intermediate_size=40,
                        n_shared_experts=3),
}


@pytest.mark.parametrize("tp", [2, 3])
@pytest.mark.parametrize("arch", list(_EP_MODELS))
def test_expert_parallel_equals_transformers(tiny_dir, arch: str, tp: int) -> None:
    """--enable-expert-parallel: each rank holds whole routed experts (8 over 3 ranks: 3, 3,
    2), computes its experts' terms only, the router whole on every rank; DeepSeek-V2's
    shared experts split over their width and its latent attention split by heads; one
    all-reduce per MoE layer. 6 heads (1 KV head, replicated, on the GQA models)."""
    path = tiny_dir(arch, 1, num_heads=6, hidden_size=96, **_EP_MODELS[arch])
    _run_group(path, tp, enable_expert_parallel=True)


def test_expert_parallel_gguf_cuts_no_expert_block(tiny_dir, tmp_path: Path) -> None:
    """A Mixtral Q8_0 GGUF over 3 ranks, expert parallel: each rank builds only its own
    experts' stored blocks, whole (3, 3 and 2 experts of 192), against transformers on the
    file's dequantization."""
    pytest.importorskip("gguf")
    from tandem.engine.loader import resolve_model
    from tandem.engine.testing.gguf_writer import write_gguf

    gguf = write_gguf(tiny_dir("mixtral", 1, num_heads=6, hidden_size=96),
                      tmp_path / "mixtral-q8_0.gguf", "Q8_0")
    cache = tmp_path / "cache"
    want = [hf_greedy(resolve_model(str(gguf), cache), p, MAX_NEW) for p in _prompts()]
    _run_group(gguf, 3, want, cache_dir=str(cache), dtype="float32", enable_expert_parallel=True)


@pytest.mark.parametrize("arch", ["deepseek_v2", "deepseek_v3"])
def test_latent_attention_over_two_ranks_equals_transformers(tiny_dir, arch: str) -> None:
    """DeepSeek MLA: 4 query heads, 2 per rank, the latent projections and cache whole on both
    ranks; layers 1 and 2 DeepSeek MoE (shared experts split, the router whole: V3's grouped
    sigmoid scores), biased latent and o projections."""
    _run_group(tiny_dir(arch, 4, num_layers=3, first_k_dense_replace=1, attention_bias=True), 2)


def test_latent_attention_over_three_ranks_equals_transformers(tiny_dir) -> None:
    """DeepSeek-V3 (q-LoRA, grouped sigmoid routing): 6 query heads, 2 per rank; the expert
    width 48 and the dense MLP's 192 split in three."""
    _run_group(tiny_dir("deepseek_v3", 6, num_heads=6, hidden_size=96, num_layers=3,
                        first_k_dense_replace=1), 3)


def test_a_moe_gguf_over_two_ranks_runs_its_experts_blocks(tiny_dir, tmp_path: Path) -> None:
    """A Mixtral Q8_0 GGUF: every expert's stored blocks cut on block boundaries (64 of the
    expert width's 128 columns per rank), against transformers on the file's dequantization."""
    pytest.importorskip("gguf")
    from tandem.engine.loader import resolve_model
    from tandem.engine.testing.gguf_writer import write_gguf

    gguf = write_gguf(tiny_dir("mixtral", 2), tmp_path / "mixtral-q8_0.gguf", "Q8_0")
    cache = tmp_path / "cache"
    reference = resolve_model(str(gguf), cache)  # what the engine converts it to
    want = [hf_greedy(reference, p, MAX_NEW) for p in _prompts()]
    _run_group(gguf, 2, want, cache_dir=str(cache), dtype="float32")


def test_a_deepseek_gguf_over_two_ranks_cuts_its_heads_blocks(tiny_dir, tmp_path: Path) -> None:
    """A DeepSeek-V2 Q8_0 GGUF (llama.cpp's attn_k_b/attn_v_b split, merged at load): q_proj's
    and o_proj's stored blocks cut by the rank's heads (v_head_dim 16: 32 o_proj columns per
    rank, one block), the experts' blocks as for any MoE; against transformers on the file's
    dequantization."""
    pytest.importorskip("gguf")
    from tandem.engine.loader import resolve_model
    from tandem.engine.testing.gguf_writer import write_gguf

    model = tiny_dir("deepseek_v2", 4, hidden_size=128, num_layers=3, first_k_dense_replace=1,
                     v_head_dim=16)
    gguf = write_gguf(model, tmp_path / "deepseek-q8_0.gguf", "Q8_0")
    cache = tmp_path / "cache"
    want = [hf_greedy(resolve_model(str(gguf), cache), p, MAX_NEW) for p in _prompts()]
    _run_group(gguf, 2, want, cache_dir=str(cache), dtype="float32")


@pytest.mark.parametrize(("spec", "arch"), [
    (QuantSpec("awq", 32), "llama"), (QuantSpec("gptq", 64), "qwen2"),
    (QuantSpec("compressed-tensors", 32, symmetric=True), "llama"),
    (QuantSpec("awq", 32), "qwen3_moe")],
    ids=["awq-g32", "gptq-g64-qkv-bias", "compressed-tensors-int4-g32", "awq-g32-moe-experts"])
def test_prequantized_over_two_ranks_equals_one_rank(tiny_dir, tmp_path: Path,
                                                     spec: QuantSpec, arch: str) -> None:
    """The checkpoint's own int4 groups, cut on group boundaries (64 o_proj and 128
    down_proj columns per rank; Qwen3-MoE: 32 of each quantized expert's 64), against the
    same checkpoint served by one process."""
    path = tmp_path / "q"
    write_prequantized(tiny_dir(arch, 2, hidden_size=128), path, spec)
    # the group's KV cache dtype (the model's): "auto" is float16 only for one process
    # running the fused native forward
    one = LLMEngine(EngineConfig.from_kwargs(
        model=str(path), num_blocks=64, block_size=16, max_num_batched_tokens=32,
        num_threads=1, kv_cache_dtype="float32"), progress=False)
    try:
        assert one.weights_format.startswith(spec.method)
        params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)
        want = engine_token_ids(one, _prompts(), params)
    finally:
        one.close()
    _run_group(path, 2, want)


def test_ngram_speculation_in_a_group_equals_transformers(tiny_dir) -> None:
    """Draft tokens verified as one chunk per request run on every rank alike."""
    path = tiny_dir("llama", 1, num_heads=6, hidden_size=96, attention_bias=True,
                    mlp_bias=True)
    engine = LLMEngine(EngineConfig.from_kwargs(
        model=str(path), num_blocks=64, tensor_parallel_size=2, num_threads=1,
        speculative_method="ngram", num_speculative_tokens=3), progress=False)
    try:
        prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6]  # n-grams to propose from
        params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
        assert engine_token_ids(engine, [prompt], params) == [hf_greedy(path, prompt, 16)]
        assert engine.stats().spec_proposed_tokens > 0  # drafts ran through the group
        assert_no_leaks(engine)
    finally:
        engine.close()


@pytest.mark.parametrize("smaller", [True, False], ids=["smaller-draft", "target-as-draft"])
def test_draft_model_speculation_in_a_group_equals_one_rank(tiny_dir, smaller: bool) -> None:
    """The draft checkpoint runs whole on rank 0 over its own cache; the target verifies its
    tokens in ordinary steps of the group. Greedy output equals one rank's without
    speculation (a smaller draft; the target's own checkpoint as the draft, whose guesses the
    group accepts), with a request that opts out in the same batch; no block leaks."""
    path = tiny_dir("llama", 2)  # 4 heads, 2 KV heads: one KV head per rank
    draft = tiny_dir("llama", 2, num_layers=1, hidden_size=32) if smaller else path
    plain = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)
    one = LLMEngine(EngineConfig.from_kwargs(
        model=str(path), num_blocks=64, block_size=16, max_num_batched_tokens=32,
        num_threads=1), progress=False)
    try:
        want = engine_token_ids(one, _prompts(), plain)
    finally:
        one.close()
    # the second request opts out: it shares the group's steps without drafts
    params = [dataclasses.replace(plain, speculative=i != 1) for i in range(len(want))]
    engine = LLMEngine(EngineConfig.from_kwargs(
        model=str(path), num_blocks=64, block_size=16, max_num_batched_tokens=32,
        tensor_parallel_size=2, num_threads=1, speculative_method="draft",
        draft_model=str(draft), num_speculative_tokens=3), progress=False)
    followers = [f.proc for f in engine.group._followers]  # type: ignore[union-attr]
    try:
        ids = [engine.add_request(p, sp) for p, sp in zip(_prompts(), params, strict=True)]
        got: dict[str, list[int]] = {}
        while engine.has_unfinished():
            for out in engine.step():
                if out.finished:
                    got[out.request_id] = out.token_ids
        assert [got[i] for i in ids] == want
        stats = engine.stats()
        assert stats.spec_proposed_tokens > 0
        assert smaller or stats.spec_accepted_tokens > 0  # multi-token steps on every rank
        assert_no_leaks(engine)
    finally:
        engine.close()
    assert [p.wait(timeout=60) for p in followers] == [0]


@pytest.mark.slow
def test_smollm2_q4_1_over_three_ranks_equals_transformers(smollm2_dir) -> None:
    """The default model as served (its GGUF's Q4_1 blocks, split on block boundaries) over
    3 ranks, against transformers on the same weights dequantized."""
    engine = LLMEngine(EngineConfig.from_kwargs(
        model="smollm2", dtype="float32", num_blocks=128, tensor_parallel_size=3,
        max_num_batched_tokens=64), progress=False)
    try:
        assert engine.weights_format.startswith("Q4_1")
        tok = engine.tokenizer
        prompts = [tok.encode(t) for t in (
            "The capital of France is", "def fibonacci(n):",
            "Once upon a time, in a village at the edge of a great forest, there lived")]
        params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
        got = engine_token_ids(engine, prompts, params)
        assert got == [hf_greedy(smollm2_dir, p, 16) for p in prompts]
        assert_no_leaks(engine)
    finally:
        engine.close()


def test_a_model_that_does_not_split_is_refused_before_any_rank_starts(tiny_dir) -> None:
    """4 heads over 3 ranks: the worker exits 2 naming the numbers; no rank was spawned."""
    path = tiny_dir("llama", 2)
    done = subprocess.run(
        [sys.executable, "-m", "tandem.worker.decode", "--port", "0", "--kv-port", "0",
         "--insecure", "--model", str(path), "--threads", "1", "--num-blocks", "16",
         "--tensor-parallel-size", "3"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "4 attention heads do not divide over --tensor-parallel-size 3" in done.stderr
    assert "tp-follower" not in done.stderr
