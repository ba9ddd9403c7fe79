"""The engine on tiny random checkpoints: exact agreement with transformers, and every
scheduling path (prefix hits, chunked prefill, preemption, abort, disaggregated handoff)."""

from __future__ import annotations

import math

import pytest
import torch

from tandem.engine import LLM, InvalidRequestError, SamplingParams
from tandem.engine.errors import OutOfBlocksError
from tandem.worker.convert import kv_layout
from tests.unit.engine._handoff import copy_blocks
from tests.unit.engine._reference import engine_token_ids, hf_greedy

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _prompts(lengths: list[int], seed: int = 0, vocab: int = 256) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def _run(engine, prompts, params=GREEDY) -> list[list[int]]:
    return engine_token_ids(engine, prompts, params)


@pytest.mark.parametrize(
    "arch,kv_heads", [("llama", 4), ("llama", 2), ("qwen2", 2), ("qwen3", 1), ("mistral", 2)]
)
def test_greedy_matches_transformers_batched(tiny_dir, make_engine, arch, kv_heads) -> None:
    path = tiny_dir(arch, kv_heads)
    engine = make_engine(model=str(path), num_blocks=128, block_size=16)
    prompts = _prompts([5, 17, 33, 64, 130], seed=1)
    got = _run(engine, prompts)
    for prompt, tokens in zip(prompts, got, strict=False):
        assert tokens == hf_greedy(path, prompt, GREEDY.max_tokens)


def test_prefix_cache_hit_gives_same_tokens(tiny_dir, make_engine) -> None:
    path = tiny_dir("llama", 2)
    engine = make_engine(model=str(path), num_blocks=128, block_size=16)
    shared = _prompts([70], seed=2)[0]
    first = _run(engine, [shared + [5, 6, 7]])[0]
    hits_before = engine.stats().prefix_cache_hits
    rid = engine.add_request(shared + [9, 10], GREEDY)
    outs = []
    while engine.has_unfinished():
        outs += [o for o in engine.step() if o.request_id == rid and o.finished]
        # every block in use is a live request's, the shared cached prefix included
        assert engine.stats().num_stranded_blocks == 0
    assert outs[0].num_cached_tokens == 64  # four full blocks of the shared prefix
    assert engine.stats().prefix_cache_hits - hits_before == 64
    assert outs[0].token_ids == hf_greedy(path, shared + [9, 10], GREEDY.max_tokens)
    assert first == hf_greedy(path, shared + [5, 6, 7], GREEDY.max_tokens)


def test_chunked_prefill_with_small_budget(tiny_dir, make_engine) -> None:
    path = tiny_dir("qwen2", 2)
    engine = make_engine(model=str(path), num_blocks=128, max_num_batched_tokens=16)
    prompts = _prompts([40, 7, 100], seed=3)
    got = _run(engine, prompts)
    for prompt, tokens in zip(prompts, got, strict=False):
        assert tokens == hf_greedy(path, prompt, GREEDY.max_tokens)


def test_preemption_by_recompute_keeps_outputs(tiny_dir, make_engine) -> None:
    path = tiny_dir("llama", 2)
    # 10 blocks of 4 tokens cannot hold four 20-token prompts growing by 24 tokens each.
    engine = make_engine(
        model=str(path), num_blocks=10, block_size=4, enable_prefix_caching=False
    )
    prompts = _prompts([9, 12, 6, 10], seed=4)
    got = _run(engine, prompts)
    assert engine.stats().num_preemptions > 0
    for prompt, tokens in zip(prompts, got, strict=False):
        assert tokens == hf_greedy(path, prompt, GREEDY.max_tokens)


def test_abort_at_any_point_frees_blocks(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64, max_num_batched_tokens=8)
    a = engine.add_request(_prompts([30])[0], GREEDY)  # mid chunked prefill after one step
    b = engine.add_request(_prompts([5])[0], GREEDY)  # still waiting
    engine.step()
    out = engine.abort(a)
    assert out is not None and out.finish_reason == "abort"
    engine.abort(b)
    engine.abort("never-existed")
    c = engine.add_request(_prompts([5])[0], GREEDY)
    for _ in range(3):
        engine.step()
    engine.abort(c)  # mid decode
    assert not engine.has_unfinished()


def test_stop_token_and_max_tokens(tiny_dir, make_engine) -> None:
    path = tiny_dir("llama", 2)
    engine = make_engine(model=str(path), num_blocks=64)
    prompt = _prompts([12], seed=5)[0]
    ref = hf_greedy(path, prompt, 10)
    stop_at = ref[4]
    first = ref.index(stop_at)
    params = SamplingParams(temperature=0.0, max_tokens=10, stop_token_ids=[stop_at], ignore_eos=True)
    rid = engine.add_request(prompt, params)
    final = None
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                final = out
    assert final is not None and final.request_id == rid
    assert final.finish_reason == "stop" and final.stop_reason == stop_at
    assert final.token_ids == ref[: first + 1]
    (length,) = LLM(model=str(path), progress=False, num_blocks=32).generate(
        [prompt], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    )
    assert length.finish_reason == "length" and len(length.token_ids) == 3


def test_disaggregated_handoff_equals_one_engine(tiny_dir, make_engine) -> None:
    """Prefill in engine P, ship blocks, continue in engine D: same tokens as one engine."""
    path = tiny_dir("qwen2", 2)
    prefill = make_engine(model=str(path), num_blocks=64, block_size=16)
    decode = make_engine(model=str(path), num_blocks=64, block_size=16)
    assert kv_layout(prefill.remote.kv_cache_spec()).fingerprint == kv_layout(decode.remote.kv_cache_spec()).fingerprint
    prompt = _prompts([45], seed=6)[0]
    expected = _run(prefill, [prompt])[0]

    layers_seen: list[tuple[int, bool]] = []  # (layer, whether the device still writes it)
    prefill.remote.prefill.set_layer_hook(
        lambda layer, done, ready: layers_seen.append((layer, ready.pending)))
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    rid = prefill.remote.prefill.add(prompt, one, request_id="r1")
    first = None
    while prefill.has_unfinished():
        for out in prefill.step():
            first = out.token_ids[0]
    prefill.remote.prefill.set_layer_hook(None)
    assert layers_seen == [(layer, False) for layer in range(prefill.arch.num_layers)]
    src = prefill.remote.prefill.held_block_ids(rid)

    dst = decode.remote.decode.reserve("r1", prompt, GREEDY).fill_block_ids
    assert len(dst) == len(src)
    copy_blocks(prefill, src, decode, dst, layer_by_layer=True)  # as the transfer layer would
    prefill.remote.prefill.release(rid)
    first_out = decode.remote.decode.commit("r1", first)
    tokens = list(first_out.new_token_ids)
    while decode.has_unfinished():
        for out in decode.step():
            tokens += out.new_token_ids
    assert tokens == expected


def test_reservation_abort_and_exhaustion(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=4, block_size=16)
    engine.remote.decode.reserve("x", list(range(3, 40)), GREEDY)  # 3 blocks
    with pytest.raises(OutOfBlocksError):
        engine.remote.decode.reserve("y", list(range(3, 40)), GREEDY)
    with pytest.raises(InvalidRequestError):
        engine.remote.decode.reserve("x", [5], GREEDY)
    engine.abort("x")


@pytest.mark.parametrize(
    "prompt,params,field",
    [
        ([], SamplingParams(), "prompt"),
        ([5] * 2000, SamplingParams(), "prompt"),
        ([5, 256], SamplingParams(), "prompt"),
        ([5, -1], SamplingParams(), "prompt"),
        ([5], SamplingParams(max_tokens=0), "max_tokens"),
        ([5], SamplingParams(temperature=-0.5), "temperature"),
        ([5], SamplingParams(temperature=math.nan), "temperature"),
        ([5], SamplingParams(top_p=0.0), "top_p"),
        ([5], SamplingParams(top_p=1.5), "top_p"),
        ([5], SamplingParams(top_k=-2), "top_k"),
        ([5], SamplingParams(stop=[""]), "stop"),
        ([5], SamplingParams(stop_token_ids=[999]), "stop_token_ids"),
    ],
)
def test_bad_input_is_refused_and_disturbs_nothing(tiny_dir, make_engine, prompt, params, field):
    path = tiny_dir("llama", 2)
    engine = make_engine(model=str(path), num_blocks=64, max_model_len=1024)
    good = _prompts([10], seed=7)[0]
    rid = engine.add_request(good, GREEDY)
    engine.step()
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request(prompt, params)
    assert err.value.field == field
    tokens = [engine.step() for _ in range(1)]
    assert tokens
    rest: list[int] = []
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                rest = out.token_ids
    assert rest == hf_greedy(path, good, GREEDY.max_tokens)
    assert rid


def test_seeded_sampling_is_reproducible_across_batches(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64)
    prompt = _prompts([8], seed=8)[0]
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=16, ignore_eos=True)
    alone = _run(engine, [prompt], p)[0]
    crowd = _run(engine, _prompts([5, 9, 13], seed=9) + [prompt], p)[-1]
    assert alone == crowd
    other = _run(engine, [prompt], SamplingParams(temperature=1.0, seed=99, max_tokens=16, ignore_eos=True))[0]
    assert other != alone


def test_seeded_handoff_equals_one_engine(tiny_dir, make_engine) -> None:
    """A seeded request continued on another engine draws the same tokens as one engine."""
    path = tiny_dir("llama", 2)
    a = make_engine(model=str(path), num_blocks=64)
    b = make_engine(model=str(path), num_blocks=64)
    prompt = _prompts([20], seed=11)[0]
    p = SamplingParams(temperature=1.0, top_k=20, seed=5, max_tokens=12, ignore_eos=True)
    expected = _run(a, [prompt], p)[0]
    first_p = SamplingParams(temperature=1.0, top_k=20, seed=5, max_tokens=1, ignore_eos=True)
    rid = a.remote.prefill.add(prompt, first_p, request_id="s")
    first = None
    while a.has_unfinished():
        for out in a.step():
            first = out.token_ids[0]
    dst = b.remote.decode.reserve("s", prompt, p).fill_block_ids
    copy_blocks(a, a.remote.prefill.held_block_ids(rid), b, dst)
    a.remote.prefill.release(rid)
    tokens = list(b.remote.decode.commit("s", first).new_token_ids)
    while b.has_unfinished():
        for out in b.step():
            tokens += out.new_token_ids
    assert tokens == expected


def test_llm_steps_choose_their_threads_by_measurement_unless_fixed(tiny_dir) -> None:
    """The offline API's fused CPU steps pick half or all of its threads by what they measure
    (tandem/engine/step_threads.py), as the workers' do; "fixed" keeps every step on all of
    them; anything else is refused. Either way the tokens are the same."""
    from tandem.engine.step_threads import AdaptiveThreads

    path = str(tiny_dir("llama", 2))
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    adaptive = LLM(path, progress=False, num_threads=2, dtype="float32")
    rule = adaptive.engine.runner.step_threads
    assert adaptive.engine.runner.fused is not None and isinstance(rule, AdaptiveThreads)
    got = adaptive.generate([[5, 6, 7, 8]], params)[0].token_ids
    assert rule.narrow.steps + rule.wide.steps >= 6  # every step went through the rule
    fixed = LLM(path, progress=False, num_threads=2, dtype="float32", step_threads="fixed")
    assert fixed.engine.runner.step_threads is None
    assert fixed.generate([[5, 6, 7, 8]], params)[0].token_ids == got
    with pytest.raises(ValueError, match="step_threads"):
        LLM(path, progress=False, step_threads="spin")
