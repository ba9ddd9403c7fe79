"""Forked requests (n sequences from one prompt) on tiny random checkpoints: the prompt is
computed once and shared, each sequence equals a single request seeded seed + j, on the
torch and native CPU paths, colocated and across a prefill/decode handoff; no block leaks
(the conftest checks every engine after every test)."""

from __future__ import annotations

import pytest
import torch

from tandem.engine import InvalidRequestError, SamplingParams
from tandem.engine.core.request import sequence_id
from tandem.engine.native import load
from tests.unit.engine._handoff import copy_blocks
from tests.unit.engine._reference import hf_greedy

SEEDED = SamplingParams(temperature=1.0, top_k=20, seed=11, max_tokens=12, ignore_eos=True)


def _prompt(n: int, seed: int = 0) -> list[int]:
    return torch.randint(3, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _drain(engine, outs=()) -> dict[str, list[int]]:
    """Every request's generated tokens once the engine runs dry (``outs``: earlier ones)."""
    tokens: dict[str, list[int]] = {}
    pending = list(outs)
    while True:
        for out in pending:
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        if not engine.has_unfinished():
            return tokens
        pending = engine.step()


def _singles(engine, prompt: list[int], params: SamplingParams, n: int) -> list[list[int]]:
    """What n single requests seeded seed, seed + 1, ... generate."""
    for j in range(n):
        seed = None if params.seed is None else params.seed + j
        engine.add_request(prompt, _with(params, seed=seed), request_id=f"single{j}")
    got = _drain(engine)
    return [got[f"single{j}"] for j in range(n)]


def _with(p: SamplingParams, **kw) -> SamplingParams:
    from dataclasses import replace

    return replace(p, **kw)


def _native_engine(make_engine, path, native: bool, **kw):
    if native and load() is None:
        pytest.skip("native kernels unavailable here")
    engine = make_engine(model=str(path), use_native_kernels=native, **kw)
    assert (engine.runner.fused is not None) == native
    return engine


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("length", [21, 32])  # a partial last block (copied on write); none
def test_fork_equals_seeded_single_requests(tiny_dir, make_engine, native, length) -> None:
    engine = _native_engine(make_engine, tiny_dir("llama", 2), native, num_blocks=64,
                            block_size=16)
    prompt = _prompt(length, seed=1)
    expected = _singles(engine, prompt, SEEDED, 4)
    assert len({tuple(t) for t in expected}) == 4  # four distinct samples

    engine.add_request(prompt, SEEDED, request_id="f", n=4)
    first = engine.step()  # computes the prompt once, forks, samples four first tokens
    assert sorted(o.request_id for o in first) == ["f", "f#1", "f#2", "f#3"]
    tables = {engine.kv.block_ids(sequence_id("f", j))[:2] == engine.kv.block_ids("f")[:2]
              for j in range(4)}
    assert tables == {True}
    assert engine.kv.pool.num_referenced() == -(-length // 16)  # the prompt's blocks, shared
    got = _drain(engine, first)
    assert [got[sequence_id("f", j)] for j in range(4)] == expected


@pytest.mark.parametrize("native", [False, True])
def test_greedy_fork_matches_transformers(tiny_dir, make_engine, native) -> None:
    path = tiny_dir("qwen2", 2)
    engine = _native_engine(make_engine, path, native, num_blocks=64, block_size=16)
    prompt = _prompt(19, seed=2)
    greedy = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    engine.add_request(prompt, greedy, request_id="g", n=3)
    got = _drain(engine)
    expected = hf_greedy(path, prompt, 10)
    assert [got[sequence_id("g", j)] for j in range(3)] == [expected] * 3


def test_fork_under_chunked_prefill_and_preemption(tiny_dir, make_engine) -> None:
    """The prompt in chunks, then four sequences growing in a pool too small for all of them:
    the newest are preempted and recomputed, each still equal to its single request."""
    path = tiny_dir("llama", 2)
    engine = make_engine(model=str(path), num_blocks=14, block_size=4,
                         max_num_batched_tokens=8, enable_prefix_caching=False)
    prompt = _prompt(18, seed=3)
    params = _with(SEEDED, max_tokens=14)
    expected = _singles(engine, prompt, params, 4)
    engine.add_request(prompt, params, request_id="f", n=4)
    got = _drain(engine)
    assert engine.stats().num_preemptions > 0
    assert [got[sequence_id("f", j)] for j in range(4)] == expected


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_fork_with_speculative_decoding(tiny_dir, make_engine, method) -> None:
    """Sequences speculate like single requests (the draft model's own cache is copied on
    write too)."""
    path = tiny_dir("llama", 2)
    spec = {"speculative_method": method, "num_speculative_tokens": 3}
    if method == "draft":
        spec["draft_layers"] = 1
    engine = make_engine(model=str(path), num_blocks=64, block_size=4, **spec)
    prompt = _prompt(10, seed=8) * 2  # repeats: the n-gram proposer finds matches
    expected = _singles(engine, prompt, SEEDED, 3)
    engine.add_request(prompt, SEEDED, request_id="f", n=3)
    got = _drain(engine)
    assert engine.stats().spec_proposed_tokens > 0
    assert [got[sequence_id("f", j)] for j in range(3)] == expected


def test_abort_of_one_sequence_frees_only_its_blocks(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64, block_size=16)
    prompt = _prompt(21, seed=4)
    expected = _singles(engine, prompt, SEEDED, 3)
    engine.add_request(prompt, SEEDED, request_id="f", n=3)
    outs = engine.step() + engine.step()  # forked, then each wrote its own copy
    prompt_blocks = engine.kv.block_ids("f")[:1]
    own = engine.kv.block_ids("f#1")[1]
    aborted = engine.abort("f#1")
    assert aborted is not None and aborted.finish_reason == "abort"
    assert engine.kv.pool.blocks[own].ref_cnt == 0
    assert engine.kv.pool.blocks[prompt_blocks[0]].ref_cnt == 2  # sequences 0 and 2
    got = _drain(engine, [o for o in outs if o.request_id != "f#1"])
    assert got["f"] == expected[0] and got["f#2"] == expected[2]


def test_disaggregated_fork_pushes_the_prompt_once(tiny_dir, make_engine) -> None:
    """The prefill engine samples four first tokens from one prompt computation and holds
    its blocks once; the decode engine reserves them once and forks at commit."""
    path = tiny_dir("llama", 2)
    prefill = make_engine(model=str(path), num_blocks=64, block_size=16)
    decode = make_engine(model=str(path), num_blocks=64, block_size=16)
    prompt = _prompt(37, seed=5)
    params = _with(SEEDED, logprobs=0)
    expected = _singles(prefill, prompt, params, 4)  # (the decode engine caches nothing)

    first_p = _with(params, max_tokens=1)
    prefill.remote.prefill.add(prompt, first_p, request_id="r", n=4)
    firsts = {}
    while prefill.has_unfinished():
        for out in prefill.step():
            firsts[out.request_id] = out
    assert sorted(firsts) == ["r", "r#1", "r#2", "r#3"] and all(o.finished for o in firsts.values())
    src = prefill.remote.prefill.held_block_ids("r")
    assert prefill.kv.pool.num_referenced() == len(src) == 3  # the sequences left theirs

    reservation = decode.remote.decode.reserve("r", prompt, params, transfer_id="t", n=4)
    assert len(reservation.fill_block_ids) == 3  # one reservation for the prompt, not four
    copy_blocks(prefill, src, decode, reservation.fill_block_ids)
    prefill.remote.prefill.release("r")
    seqs = [firsts[sequence_id("r", j)] for j in range(4)]
    with pytest.raises(InvalidRequestError):  # one token per sequence, or nothing happens
        decode.remote.decode.commit_forked("t", [seqs[0].token_ids[0]])
    outs = decode.remote.decode.commit_forked("t", [o.token_ids[0] for o in seqs],
                                [o.logprobs[0].logprob for o in seqs])
    assert outs is not None and [o.request_id for o in outs] == ["r", "r#1", "r#2", "r#3"]
    assert [o.logprobs[0].logprob for o in outs] == [o.logprobs[0].logprob for o in seqs]
    got = _drain(decode, outs)
    assert [got[sequence_id("r", j)] for j in range(4)] == expected
    assert decode.remote.decode.commit_forked("t", [1, 2, 3, 4]) is None  # already committed


def test_forked_reservation_prefilled_locally(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64, block_size=16)
    prompt = _prompt(21, seed=6)
    expected = _singles(engine, prompt, SEEDED, 3)
    engine.remote.decode.reserve("r", prompt, SEEDED, transfer_id="t", n=3)
    engine.remote.decode.prefill_locally("r")
    got = _drain(engine)
    assert [got[sequence_id("r", j)] for j in range(3)] == expected


def test_unseeded_fork_gives_distinct_samples(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64, block_size=16, seed=3)
    engine.add_request(_prompt(9, seed=7), _with(SEEDED, seed=None), request_id="u", n=4)
    got = _drain(engine)
    assert len({tuple(got[sequence_id("u", j)]) for j in range(4)}) == 4


@pytest.mark.parametrize(("kw", "field"), [
    ({"n": 0}, "n"),
    ({"n": 129}, "n"),
    ({"n": True}, "n"),
    ({"n": 2, "prior_output_tokens": 1}, "n"),
    ({"n": 2, "request_id": "a#1"}, "request_id"),
])
def test_bad_fork_is_refused(tiny_dir, make_engine, kw, field) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=16)
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request([5, 6, 7], SEEDED, **kw)
    assert err.value.field == field
    with pytest.raises(InvalidRequestError):
        engine.remote.decode.reserve("x", [5, 6, 7], SEEDED, transfer_id="t", n=0)
    assert engine.kv.pool.num_referenced() == 0
