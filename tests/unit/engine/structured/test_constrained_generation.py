"""Structured outputs through the engine: every sample matches its grammar, seeds reproduce,
unconstrained rows are untouched, and speculation, resumption and the remote-KV handoff keep
the constrained stream identical."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest

from tandem.engine import InvalidRequestError, SamplingParams
from tandem.engine.structured.spec import StructuredOutput
from tests.unit.engine._handoff import copy_blocks

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "color": {"enum": ["red", "green", "blue"]},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8},
                           "zip": {"type": "integer", "minimum": 10000, "maximum": 99999}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
    },
    "required": ["name", "age", "color", "address", "tags"],
    "additionalProperties": False,
}
JSON_SPEC = StructuredOutput("json_schema", json.dumps(SCHEMA))
PROMPT = [1, 4093, 198, 2]  # any short prompt: the grammar decides the shape


def _run(engine, requests: list[tuple[list[int], SamplingParams]]) -> list:
    ids = [engine.add_request(p, sp) for p, sp in requests]
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return [done[i] for i in ids]


@pytest.fixture(scope="module")
def engine(tiny_vocab_dir, make_engine):
    return make_engine(model=str(tiny_vocab_dir), num_blocks=2048, block_size=16,
                       max_num_seqs=128)


def test_a_hundred_seeded_samples_all_validate(engine) -> None:
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=200, structured=JSON_SPEC)
              for s in range(100)]
    outs = _run(engine, [(PROMPT, p) for p in params])
    for out in outs:
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), SCHEMA)
    assert len({o.text for o in outs}) > 50  # the samples differ
    again = _run(engine, [(PROMPT, params[7])])[0]
    assert again.token_ids == outs[7].token_ids  # a seed reproduces its sample


def test_unconstrained_rows_are_untouched_by_constrained_neighbours(engine) -> None:
    # Same batch size both times: the CPU kernels pick their loop by row count.
    free = [SamplingParams(temperature=1.0, seed=s, max_tokens=20, ignore_eos=True)
            for s in range(8)]
    alone = _run(engine, [(PROMPT, p) for p in free])
    mixed = _run(engine, [(PROMPT, p) for p in free[:4]]
                 + [(PROMPT, dataclasses.replace(p, ignore_eos=False, structured=JSON_SPEC,
                                                 min_tokens=0, max_tokens=200))
                    for p in free[4:]])
    assert [o.token_ids for o in mixed[:4]] == [o.token_ids for o in alone[:4]]
    assert all(o.finish_reason == "stop" for o in mixed[4:])


@pytest.mark.parametrize(
    ("spec", "check"),
    [
        (StructuredOutput("choice", ("alpha", "beta", "gamma delta")),
         lambda t: t in ("alpha", "beta", "gamma delta")),
        (StructuredOutput("regex", r"[0-9]{3}-[a-z]{2,4}"),
         lambda t: __import__("re").fullmatch(r"[0-9]{3}-[a-z]{2,4}", t) is not None),
        # bounded (at most four terms): a random model may never choose to close an
        # unbounded repetition, and the test is about the constraint, not that choice
        (StructuredOutput("grammar", 'root ::= "(" num ("+" num)? ("+" num)? ("+" num)? ")"\n'
                                     'num ::= [1-9] [0-9]?'),
         lambda t: __import__("re").fullmatch(r"\([1-9][0-9]?(\+[1-9][0-9]?){0,3}\)", t)
         is not None),
    ],
)
def test_every_kind_constrains_greedy_and_sampled_output(engine, spec, check) -> None:
    params = [SamplingParams(temperature=t, seed=s, max_tokens=400, structured=spec)
              for t, s in [(0.0, None), (1.0, 1), (1.0, 2), (0.7, 3)]]
    for out in _run(engine, [(PROMPT, p) for p in params]):
        assert out.finish_reason == "stop" and check(out.text), out.text


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_speculation_gives_the_same_constrained_stream(tiny_vocab_dir, make_engine, engine,
                                                       temperature) -> None:
    spec_engine = make_engine(model=str(tiny_vocab_dir), num_blocks=512, block_size=16,
                              speculative_method="ngram", num_speculative_tokens=4)
    params = SamplingParams(temperature=temperature, seed=5, max_tokens=200, structured=JSON_SPEC)
    plain = _run(engine, [(PROMPT, params)])[0]
    spec = _run(spec_engine, [(PROMPT, params)])[0]
    assert spec.token_ids == plain.token_ids
    assert spec_engine.stats().spec_proposed_tokens > 0  # drafts were checked, some refused


@pytest.mark.parametrize("k", [1, 9])
def test_a_resumed_request_replays_its_grammar(engine, k) -> None:
    params = SamplingParams(temperature=1.0, seed=11, max_tokens=200, structured=JSON_SPEC)
    full = _run(engine, [(PROMPT, params)])[0].token_ids
    rid = engine.add_request(PROMPT + full[:k], params, prior_output_tokens=k)
    out = None
    while engine.has_unfinished():
        for o in engine.step():
            if o.request_id == rid and o.finished:
                out = o
    assert out is not None and out.token_ids == full


def test_remote_kv_handoff_keeps_the_grammar(tiny_vocab_dir, make_engine, engine) -> None:
    decode = make_engine(model=str(tiny_vocab_dir), num_blocks=256, block_size=16)
    params = SamplingParams(temperature=0.0, max_tokens=200, structured=JSON_SPEC)
    expected = _run(engine, [(PROMPT, params)])[0].token_ids
    first = _run(engine, [(PROMPT, dataclasses.replace(params, max_tokens=1))])[0].token_ids[0]
    assert first == expected[0]

    got = decode.remote.decode.reserve("r", PROMPT, params)
    with pytest.raises(InvalidRequestError, match="grammar"):
        decode.remote.decode.commit("r", 198)  # "\n": a JSON schema output starts with "{"
    rid = engine.remote.prefill.add(PROMPT, dataclasses.replace(params, max_tokens=1))
    _run(engine, [])
    copy_blocks(engine, engine.remote.prefill.held_block_ids(rid), decode, got.fill_block_ids)
    engine.remote.prefill.release(rid)
    tokens = list(decode.remote.decode.commit("r", first).new_token_ids)
    while decode.has_unfinished():
        for out in decode.step():
            tokens += out.new_token_ids
    assert tokens == expected


def test_logit_bias_moves_the_pick(engine) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    plain = _run(engine, [(PROMPT, greedy)])[0].token_ids
    forced = _run(engine, [(PROMPT, dataclasses.replace(greedy, logit_bias={777: 100.0}))])[0]
    banned = _run(engine, [(PROMPT, dataclasses.replace(greedy, logit_bias={plain[0]: -100.0}))])
    assert forced.token_ids == [777] * 4
    assert banned[0].token_ids[0] != plain[0]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        (SamplingParams(structured=JSON_SPEC, ignore_eos=True), "ignore_eos"),
        (SamplingParams(structured=JSON_SPEC, min_tokens=2), "min_tokens"),
        (SamplingParams(logit_bias={49152: 1.0}), "logit_bias"),
        (SamplingParams(logit_bias={5: 101.0}), "logit_bias"),
        (SamplingParams(logit_bias={i: 1.0 for i in range(301)}), "logit_bias"),
        (SamplingParams(structured=StructuredOutput("regex", "([")),
         "structured_outputs.regex"),
    ],
)
def test_bad_combinations_are_refused(engine, params, field) -> None:
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request(PROMPT, params)
    assert err.value.field == field


def test_json_object_on_a_real_model(smollm2_dir, make_engine) -> None:
    # Any object: its keys and strings are unbounded, so this needs a model that closes them.
    engine = make_engine(model=str(smollm2_dir), num_blocks=256)
    prompt = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Reply in JSON with two keys, name and age, for a cat called Tom aged 3."}],
        add_generation_prompt=True, tokenize=False,
    )
    spec = StructuredOutput("json_object")
    ids = engine.tokenizer.encode(prompt, add_special_tokens=False)
    out = _run(engine, [(ids, SamplingParams(temperature=0.0, max_tokens=160, structured=spec))])
    assert out[0].finish_reason == "stop", out[0].text
    assert isinstance(json.loads(out[0].text), dict)
