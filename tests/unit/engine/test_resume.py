"""Resuming a request elsewhere (migration): a request whose first k output tokens are handed
in as the tail of its prompt, flagged with ``prior_output_tokens=k``, continues exactly as the
uninterrupted request would, for seeded sampling with penalties, min/max tokens and stop
strings, whether prefilled locally or through remote.decode.reserve/commit."""

from __future__ import annotations

import dataclasses

import pytest

from tandem.engine import InvalidRequestError, SamplingParams
from tests.unit.engine._handoff import copy_blocks
from tests.unit.engine.test_engine_tiny import _prompts


def _finish(engine, rid: str):
    final = None
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == rid and out.finished:
                final = out
    assert final is not None
    return final


SEEDED = SamplingParams(
    temperature=1.0, top_p=0.9, seed=1234, max_tokens=24, min_tokens=20,
    frequency_penalty=0.7, presence_penalty=0.3, repetition_penalty=1.2,
)


@pytest.mark.parametrize("k", [1, 5, 17])
def test_resumed_seeded_request_continues_identically(tiny_dir, make_engine, k) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64, block_size=16)
    prompt = _prompts([21], seed=3)[0]
    full = _finish(engine, engine.add_request(prompt, SEEDED)).token_ids
    assert len(full) == SEEDED.max_tokens
    resumed = _finish(
        engine, engine.add_request(prompt + full[:k], SEEDED, prior_output_tokens=k)
    )
    assert resumed.token_ids == full  # the k given tokens, then the same continuation
    assert len(resumed.prompt_token_ids) == len(prompt)


def test_resumed_through_remote_kv(tiny_dir, make_engine) -> None:
    """The disaggregated resume: engine A prefills prompt + prior, engine B continues."""
    path = str(tiny_dir("llama", 2))
    a = make_engine(model=path, num_blocks=64, block_size=16)
    b = make_engine(model=path, num_blocks=64, block_size=16)
    prompt = _prompts([30], seed=4)[0]
    full = _finish(b, b.add_request(prompt, SEEDED)).token_ids
    k = 6
    tokens = prompt + full[:k]
    # What a prefill worker does: sample one more token than the request already has.
    first_params = dataclasses.replace(SEEDED, max_tokens=k + 1, min_tokens=k + 1)
    rid = a.remote.prefill.add(tokens, first_params, prior_output_tokens=k)
    first = _finish(a, rid).token_ids[-1]
    got = b.remote.decode.reserve("r", tokens, SEEDED, prior_output_tokens=k)
    # B ran the prompt itself first, so it reuses its cached prefix: only the rest moves.
    skip = got.cached_tokens // 16
    assert skip == 2  # prompt + full[:2] were cached by B's own run
    src = a.remote.prefill.held_block_ids(rid)[skip:]
    assert len(src) == len(got.fill_block_ids) == 1
    copy_blocks(a, src, b, got.fill_block_ids)
    a.remote.prefill.release(rid)
    b.remote.decode.commit("r", first)
    assert _finish(b, "r").token_ids == full


def test_resumed_stop_string_spanning_the_cut(smollm2_dir, make_engine) -> None:
    """A stop string that began before the cut still ends the resumed request."""
    engine = make_engine(model=str(smollm2_dir), dtype="float32", num_blocks=64)
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompt = engine.tokenizer.encode("The capital of France is")
    plain = _finish(engine, engine.add_request(prompt, greedy))
    text = engine.tokenizer.decode(plain.token_ids)
    # A stop string made of the text of output tokens 3..5: resume after token 4, mid-match.
    stop = engine.tokenizer.decode(plain.token_ids[3:6])
    assert stop.strip() and stop in text
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop=[stop])
    whole = _finish(engine, engine.add_request(prompt, params))
    resumed = _finish(
        engine,
        engine.add_request(prompt + whole.token_ids[:4], params, prior_output_tokens=4),
    )
    assert whole.finish_reason == resumed.finish_reason == "stop"
    assert resumed.token_ids == whole.token_ids
    assert resumed.text.endswith(whole.text[-3:]) or whole.text == ""


def test_prior_output_tokens_out_of_range(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=16, block_size=16)
    for bad in (-1, 3, True):
        with pytest.raises(InvalidRequestError, match="prior_output_tokens"):
            engine.add_request([5, 6, 7], SEEDED, prior_output_tokens=bad)
