"""A grammar deferred past a reasoning model's end-of-thinking token
(``StructuredOutput.after_token``): the output up to and including that token is exactly the
unconstrained one (the thinking is free), what follows matches the grammar; speculation,
resumption across the token and the remote-KV handoff keep the stream identical.

The "end of thinking" is a token the tiny random model emits on its own when greedy (its
first occurrence in the free output), so the test knows where the thinking ends without a
trained reasoning model."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jsonschema
import pytest
from tokenizers import Tokenizer

from tandem.engine import InvalidRequestError, SamplingParams
from tandem.engine.structured.spec import StructuredOutput
from tests.unit.engine._handoff import copy_blocks
from tests.unit.engine.structured.test_constrained_generation import PROMPT, _run

THINK = 12  # free tokens looked at for the end-of-thinking token
SCHEMA = {  # small: a random model's answer stays short
    "type": "object",
    "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "color": {"enum": ["red", "green", "blue"]}},
    "required": ["age", "color"],
    "additionalProperties": False,
}
JSON_SPEC = StructuredOutput("json_schema", json.dumps(SCHEMA))


@pytest.fixture(scope="module")
def engine(tiny_vocab_dir, make_engine):
    return make_engine(model=str(tiny_vocab_dir), num_blocks=512, block_size=16)


@pytest.fixture(scope="module")
def thinking(engine) -> tuple[list[int], int]:
    """(the free greedy output, k): ``free[k]`` plays the end-of-thinking token (its first
    occurrence, after at least three free tokens, before any EOS)."""
    free = _run(engine, [(PROMPT, SamplingParams(temperature=0.0, max_tokens=THINK,
                                                 ignore_eos=True))])[0].token_ids
    k = next(i for i in range(3, THINK)
             if free[i] not in free[:i] and free[i] not in engine.eos_token_ids)
    return list(free), k


@pytest.fixture(scope="module")
def answered(engine, thinking) -> list[int]:
    """The deferred request's whole greedy output."""
    free, k = thinking
    return list(_run(engine, [(PROMPT, _deferred(free[k]))])[0].token_ids)


def _deferred(after: int, max_tokens: int = 200) -> SamplingParams:
    spec = dataclasses.replace(JSON_SPEC, after_token=after)
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, structured=spec)


def _answer(tiny_vocab_dir: Path, ids: list[int]) -> object:
    text = Tokenizer.from_file(str(tiny_vocab_dir / "tokenizer.json")).decode(ids)
    return json.loads(text)


def test_the_thinking_is_free_and_the_answer_matches_the_grammar(
    engine, thinking, answered, tiny_vocab_dir,
) -> None:
    free, k = thinking
    assert answered[:k + 1] == free[:k + 1]  # untouched up to the end of thinking
    assert answered[-1] in engine.eos_token_ids  # the grammar ended the output
    jsonschema.validate(_answer(tiny_vocab_dir, answered[k + 1:-1]), SCHEMA)
    # without the deferral the grammar writes the output from its first token
    whole = _run(engine, [(PROMPT, SamplingParams(temperature=0.0, max_tokens=200,
                                                  structured=JSON_SPEC))])[0]
    assert whole.token_ids[:k + 1] != free[:k + 1]
    jsonschema.validate(json.loads(whole.text), SCHEMA)


def test_a_token_that_never_comes_leaves_the_output_free(engine, thinking) -> None:
    free, _ = thinking
    never = next(t for t in range(3, 50000) if t not in free)
    out = _run(engine, [(PROMPT, _deferred(never, max_tokens=THINK - 1))])[0]
    assert out.token_ids == free[:THINK - 1] and out.finish_reason == "length"


def test_speculation_gives_the_same_deferred_stream(tiny_vocab_dir, make_engine, thinking,
                                                    answered) -> None:
    free, k = thinking
    spec_engine = make_engine(model=str(tiny_vocab_dir), num_blocks=512, block_size=16,
                              speculative_method="ngram", num_speculative_tokens=4)
    spec = _run(spec_engine, [(PROMPT, _deferred(free[k]))])[0]
    assert spec.token_ids == answered
    assert spec_engine.stats().spec_proposed_tokens > 0


@pytest.mark.parametrize("where", ["thinking", "at-the-end", "answer"])
def test_a_resumed_request_replays_across_the_end_of_thinking(engine, thinking, answered,
                                                              where: str) -> None:
    free, k = thinking
    params, full = _deferred(free[k]), answered
    n = {"thinking": k - 1, "at-the-end": k + 1, "answer": k + 4}[where]
    rid = engine.add_request(PROMPT + full[:n], params, prior_output_tokens=n)
    out = None
    while engine.has_unfinished():
        for o in engine.step():
            if o.request_id == rid and o.finished:
                out = o
    assert out is not None and out.token_ids == full


def test_remote_kv_handoff_checks_the_first_token_only_once_the_grammar_opens(
    tiny_vocab_dir, make_engine, engine, thinking, answered,
) -> None:
    free, k = thinking
    params, expected = _deferred(free[k]), answered
    decode = make_engine(model=str(tiny_vocab_dir), num_blocks=256, block_size=16)
    got = decode.remote.decode.reserve("r", PROMPT, params)
    rid = engine.remote.prefill.add(PROMPT, dataclasses.replace(params, max_tokens=1))
    _run(engine, [])
    copy_blocks(engine, engine.remote.prefill.held_block_ids(rid), decode, got.fill_block_ids)
    engine.remote.prefill.release(rid)
    # the first token would break a JSON answer, but it is still thinking: accepted
    assert not engine.grammars.constraint(JSON_SPEC).allows(expected[0])
    assert decode.grammars.constraint(params.structured).allows(expected[0])
    tokens = list(decode.remote.decode.commit("r", expected[0]).new_token_ids)
    while decode.has_unfinished():
        for out in decode.step():
            tokens += out.new_token_ids
    assert tokens == expected


def test_an_after_token_outside_the_vocabulary_is_refused(engine) -> None:
    for after in (-1, 49152):
        with pytest.raises(InvalidRequestError) as err:
            engine.add_request(PROMPT, _deferred(after))
        assert err.value.field == "structured_outputs.after_token"
