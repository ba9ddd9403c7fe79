"""Prompt logprobs (``SamplingParams.prompt_logprobs``) on tiny checkpoints, against
transformers' log_softmax of its logits on the same weights: both forwards (torch, native
fused), chunked prefill, prefix-cache hits, preemption, ``max_tokens`` 0, and what a request
that did not ask sees."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tandem.engine import LLM, SamplingParams
from tandem.engine.errors import InvalidRequestError
from tandem.engine.native import load
from tandem.engine.outputs import RequestOutput, TokenLogprob
from tests.unit.engine._reference import hf_greedy, hf_prompt_logprobs

K = 5


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 256, (n,), generator=g).tolist()


def _run(engine: Any, requests: list[tuple[list[int], SamplingParams]]) -> list[list[RequestOutput]]:
    """Every output of each request, in step order."""
    ids = [engine.add_request(p, params) for p, params in requests]
    outs: dict[str, list[RequestOutput]] = {rid: [] for rid in ids}
    while engine.has_unfinished():
        for out in engine.step():
            outs[out.request_id].append(out)
    return [outs[rid] for rid in ids]


def _scored(prompt_logprobs: int = K, max_tokens: int = 3, **kw: Any) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                          prompt_logprobs=prompt_logprobs, **kw)


def _assert_matches(lps: list[TokenLogprob | None] | None, ref: torch.Tensor,
                    prompt: list[int], k: int = K, atol: float = 1e-4) -> None:
    """``lps`` is transformers' ``ref`` [len(prompt), V] gathered at the next tokens, + top-k."""
    assert lps is not None and len(lps) == len(prompt) and lps[0] is None
    for i, entry in enumerate(lps[1:], start=1):
        assert entry is not None and entry.token_id == prompt[i]
        assert entry.logprob == pytest.approx(ref[i - 1, prompt[i]].item(), abs=atol)
        vals, idx = torch.topk(ref[i - 1], k)
        assert [t for t, _ in entry.top] == idx.tolist()
        assert [v for _, v in entry.top] == pytest.approx(vals.tolist(), abs=atol)


def _assert_same(a: list[TokenLogprob | None], b: list[TokenLogprob | None],
                 atol: float = 1e-5) -> None:
    assert len(a) == len(b) and a[0] is None and b[0] is None
    for x, y in zip(a[1:], b[1:], strict=True):
        assert x is not None and y is not None and x.token_id == y.token_id
        assert x.logprob == pytest.approx(y.logprob, abs=atol)
        assert [t for t, _ in x.top] == [t for t, _ in y.top]
        assert [v for _, v in x.top] == pytest.approx([v for _, v in y.top], abs=atol)


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_prompt_logprobs_match_transformers(tiny_dir, make_engine, arch, native) -> None:
    if native and load() is None:
        pytest.skip("native kernels unavailable here")
    path = tiny_dir(arch, 2)
    engine = make_engine(model=str(path), num_blocks=64, block_size=16,
                         use_native_kernels=native)
    assert (engine.runner.fused is not None) == native
    prompt = _prompt(37, seed=1)
    (outs,) = _run(engine, [(prompt, _scored())])
    _assert_matches(outs[0].prompt_logprobs, hf_prompt_logprobs(path, prompt), prompt)
    assert all(o.prompt_logprobs is None for o in outs[1:])  # on the first output only
    assert outs[-1].token_ids == hf_greedy(path, prompt, 3)


def test_top_zero_and_one_token_prompt(tiny_dir, make_engine) -> None:
    path = tiny_dir("llama", 2)
    engine = make_engine(model=str(path), num_blocks=64)
    prompt = _prompt(9, seed=2)
    (outs, single) = _run(engine, [(prompt, _scored(0)), ([7], _scored(0))])
    _assert_matches(outs[0].prompt_logprobs, hf_prompt_logprobs(path, prompt), prompt, k=0)
    assert single[0].prompt_logprobs == [None]  # nothing precedes the first token


@pytest.mark.parametrize("n", [17, 23, 40])  # 17: the last chunk holds only the last position
def test_chunked_prefill_equals_one_chunk(tiny_dir, make_engine, n) -> None:
    path = tiny_dir("qwen2", 2)
    prompt = _prompt(n, seed=3)
    whole = make_engine(model=str(path), num_blocks=64)
    chunked = make_engine(model=str(path), num_blocks=64, max_num_batched_tokens=8)
    (one,) = _run(whole, [(prompt, _scored())])
    (many,) = _run(chunked, [(prompt, _scored())])
    assert len(many) == len(one)  # the chunk steps report nothing: one output per token
    _assert_same(many[0].prompt_logprobs, one[0].prompt_logprobs)
    _assert_matches(many[0].prompt_logprobs, hf_prompt_logprobs(path, prompt), prompt)
    assert many[-1].token_ids == one[-1].token_ids


def test_cached_prefix_is_recomputed_and_still_cached(tiny_dir, make_engine) -> None:
    path = tiny_dir("llama", 2)
    engine = make_engine(model=str(path), num_blocks=64, block_size=16)
    shared = _prompt(48, seed=4)
    plain = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    _run(engine, [(shared + [5, 6], plain)])  # the three blocks of `shared` are cached now
    hits = engine.stats().prefix_cache_hits
    prompt = shared + [9, 10, 11]
    (outs,) = _run(engine, [(prompt, _scored())])
    assert outs[0].num_cached_tokens == 0 and engine.stats().prefix_cache_hits == hits
    _assert_matches(outs[0].prompt_logprobs, hf_prompt_logprobs(path, prompt), prompt)
    # a scored request still fills the cache for others
    (after,) = _run(engine, [(prompt + [12], plain)])
    assert after[-1].num_cached_tokens == 48


def test_max_tokens_zero_scores_and_frees(tiny_dir, make_engine) -> None:
    path = tiny_dir("llama", 2)
    engine = make_engine(model=str(path), num_blocks=64, max_num_batched_tokens=8)
    prompt = _prompt(30, seed=5)
    other = _prompt(6, seed=6)
    plain = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    (outs, side) = _run(engine, [(prompt, _scored(max_tokens=0)), (other, plain)])
    (out,) = outs  # one output, when its prefill completes
    assert out.finished and out.finish_reason == "length"
    assert out.token_ids == [] and out.new_token_ids == [] and out.text == ""
    _assert_matches(out.prompt_logprobs, hf_prompt_logprobs(path, prompt), prompt)
    assert engine.outputs.num_generated_tokens == 5  # nothing was sampled for it
    stats = engine.stats()
    assert stats.num_free_blocks == stats.num_blocks and engine.kv.pool.num_referenced() == 0
    assert side[-1].token_ids == hf_greedy(path, other, 5)


def test_preempted_mid_prefill_scores_the_same(tiny_dir, make_engine) -> None:
    path = tiny_dir("llama", 2)
    # 12 blocks of 4: a growing decode and a 36-token scored prompt cannot both fit, so the
    # scored request (the newest) is preempted during its chunked prefill and recomputed
    engine = make_engine(model=str(path), num_blocks=12, block_size=4, max_num_batched_tokens=8)
    first = _prompt(8, seed=7)
    prompt = _prompt(36, seed=8)
    plain = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    (a, b) = _run(engine, [(first, plain), (prompt, _scored(max_tokens=1))])
    assert engine.stats().num_preemptions > 0
    assert a[-1].token_ids == hf_greedy(path, first, 30)
    _assert_matches(b[0].prompt_logprobs, hf_prompt_logprobs(path, prompt), prompt)


@pytest.mark.parametrize("native", [False, True])
def test_other_requests_in_the_batch_are_unaffected(tiny_dir, make_engine, native) -> None:
    if native and load() is None:
        pytest.skip("native kernels unavailable here")
    path = tiny_dir("llama", 2)
    plain = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3)
    mine, theirs = _prompt(20, seed=9), _prompt(25, seed=10)
    alone_engine = make_engine(model=str(path), num_blocks=64, use_native_kernels=native)
    mixed_engine = make_engine(model=str(path), num_blocks=64, use_native_kernels=native)
    (alone,) = _run(alone_engine, [(mine, plain)])
    (mixed, scored, zero) = _run(mixed_engine, [
        (mine, plain), (theirs, _scored(max_tokens=4)), (theirs[:11], _scored(max_tokens=0)),
    ])
    assert [o.new_token_ids for o in mixed] == [o.new_token_ids for o in alone]
    assert all(o.prompt_logprobs is None for o in mixed)
    for got, want in zip(mixed, alone, strict=True):
        assert got.logprobs is not None and want.logprobs is not None
        for x, y in zip(got.logprobs, want.logprobs, strict=True):
            assert x.logprob == pytest.approx(y.logprob, abs=1e-4)
            assert [t for t, _ in x.top] == [t for t, _ in y.top]
    _assert_matches(scored[0].prompt_logprobs, hf_prompt_logprobs(path, theirs), theirs)
    _assert_matches(zero[0].prompt_logprobs, hf_prompt_logprobs(path, theirs[:11]), theirs[:11])


def test_quantized_native_echo_agrees_with_sampled_logprobs(tiny_dir, make_engine) -> None:
    """With int8 weights (no transformers reference), scoring prompt + continuation gives the
    logprobs the engine reported while generating that continuation."""
    if load() is None:
        pytest.skip("native kernels unavailable here")
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64, quantization="int8")
    assert engine.runner.fused is not None
    prompt = _prompt(12, seed=11)
    gen = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2)
    (outs,) = _run(engine, [(prompt, gen)])
    tokens = outs[-1].token_ids
    sampled = [lp for o in outs for lp in (o.logprobs or [])]
    (echo,) = _run(engine, [(prompt + tokens, _scored(2, max_tokens=0))])
    lps = echo[0].prompt_logprobs
    assert lps is not None
    # decode rows take int16 activations, a prefill chunk the fp32 GEMM: ~1e-5 relative apart
    for got, want in zip(lps[len(prompt):], sampled, strict=True):
        assert got is not None and got.token_id == want.token_id
        assert got.logprob == pytest.approx(want.logprob, abs=5e-4)
        assert [t for t, _ in got.top] == [t for t, _ in want.top]


def test_prefill_role_reports_them_and_decode_role_does_not(tiny_dir, make_engine) -> None:
    """The prefill worker's first output (hold_kv, max_tokens 1) carries the prompt logprobs;
    the decode side's committed output carries none (its KV was computed elsewhere)."""
    path = tiny_dir("llama", 2)
    prefill = make_engine(model=str(path), num_blocks=64, block_size=16)
    decode = make_engine(model=str(path), num_blocks=64, block_size=16)
    prompt = _prompt(21, seed=12)
    rid = prefill.remote.prefill.add(prompt, _scored(max_tokens=1), request_id="r")
    (out,) = [o for _ in range(2) for o in prefill.step()]
    assert out.finished and len(out.token_ids) == 1
    _assert_matches(out.prompt_logprobs, hf_prompt_logprobs(path, prompt), prompt)
    decode.remote.decode.reserve("r", prompt, _scored(max_tokens=2))
    first = decode.remote.decode.commit("r", out.token_ids[0])
    assert first is not None and first.prompt_logprobs is None
    prefill.remote.prefill.release(rid)
    while decode.has_unfinished():
        assert all(o.prompt_logprobs is None for o in decode.step())


def test_offline_llm_returns_them(tiny_dir) -> None:
    path = tiny_dir("llama", 2)
    prompt = _prompt(10, seed=13)
    (done,) = LLM(model=str(path), progress=False, num_blocks=32,
                  kv_cache_dtype="float32").generate(  # transformers: float32 attention
        [prompt], _scored(max_tokens=0))
    assert done.token_ids == [] and done.finish_reason == "length"
    _assert_matches(done.prompt_logprobs, hf_prompt_logprobs(path, prompt), prompt)


@pytest.mark.parametrize("kw,field", [
    ({"prompt_logprobs": 21}, "prompt_logprobs"),
    ({"prompt_logprobs": -1}, "prompt_logprobs"),
    ({"prompt_logprobs": 1.5}, "prompt_logprobs"),
    ({"prompt_logprobs": True}, "prompt_logprobs"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 0, "logprobs": 2}, "max_tokens"),
    ({"max_tokens": -1, "prompt_logprobs": 0}, "max_tokens"),
    ({"max_tokens": 0, "min_tokens": 1, "prompt_logprobs": 0}, "min_tokens"),
])
def test_bad_values_are_refused(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**kw).validate(256)
    assert err.value.field == field


def test_good_values_pass() -> None:
    for params in (SamplingParams(prompt_logprobs=0), SamplingParams(prompt_logprobs=20),
                   SamplingParams(prompt_logprobs=3, max_tokens=0)):
        params.validate(256)
