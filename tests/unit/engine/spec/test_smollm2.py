"""Speculative greedy on SmolLM2-135M equals plain greedy and transformers' generate(), with
prompt lookup and with the model's first layers as the draft, alone and batched with a request
that opts out; a stop string inside an accepted run still cuts the text there."""

from __future__ import annotations

import pytest

from bench.engine.lookup import MOVING_AVERAGE as DOC
from tandem.engine import SamplingParams
from tests.unit.engine._reference import hf_greedy

pytestmark = pytest.mark.slow

MAX_NEW = 40


def _chat(tok, text: str) -> str:
    return tok.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )


def _prompts(tok) -> list[str]:
    return [
        _chat(tok, "Rename the variable `total` to `running_sum` in this function.\n\n" + DOC),
        _chat(tok, "Repeat this code exactly.\n\n" + DOC),
        "The capital of France is",
    ]


def _generate(engine, prompts, params) -> list:
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    got = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                got[out.request_id] = out
    return [got[i] for i in ids]


@pytest.mark.parametrize("spec", [
    {"speculative_method": "ngram", "num_speculative_tokens": 4},
    # an untrained early exit guesses poorly: this proves exactness, not speed
    {"speculative_method": "draft", "draft_layers": 6, "num_speculative_tokens": 3},
], ids=["ngram", "draft"])
def test_speculative_greedy_equals_plain_and_transformers(make_engine, smollm2_dir, spec) -> None:
    engine = make_engine(model=str(smollm2_dir), dtype="float32", num_blocks=256, **spec)
    tok = engine.tokenizer
    prompts = _prompts(tok)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    opt_out = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True,
                             speculative=False)
    batched = _generate(engine, prompts, [greedy, greedy, opt_out])
    alone = _generate(engine, prompts[:1], [greedy])[0]
    assert alone.token_ids == batched[0].token_ids
    for out in batched:
        assert out.token_ids == hf_greedy(smollm2_dir, out.prompt_token_ids, MAX_NEW)
        assert out.text == tok.decode(out.token_ids, skip_special_tokens=True)
    st = engine.stats()
    assert st.spec_proposed_tokens > 0
    if spec["speculative_method"] == "ngram":  # the code is copied: lookup pays
        assert st.spec_accepted_tokens > 0 and st.spec_tokens_per_step > 1.0


def test_stop_string_inside_an_accepted_run(make_engine, smollm2_dir) -> None:
    engine = make_engine(model=str(smollm2_dir), dtype="float32", num_blocks=256,
                         speculative_method="ngram", num_speculative_tokens=6)
    prompt = _chat(engine.tokenizer, "Repeat this code exactly.\n\n" + DOC)
    plain = _generate(engine, [prompt], [SamplingParams(temperature=0.0, max_tokens=60,
                                                        speculative=False)])[0]
    assert "window" in plain.text
    cut = SamplingParams(temperature=0.0, max_tokens=60, stop=["window"])
    out = _generate(engine, [prompt], [cut])[0]
    assert out.finish_reason == "stop" and out.stop_reason == "window"
    assert out.text == plain.text[: plain.text.index("window")]
