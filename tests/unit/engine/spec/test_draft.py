"""Draft-model speculation on tiny checkpoints: the target's first layers or a separate small
checkpoint as the draft, greedy output identical to plain decoding (alone, batched with
requests that opt out, after preemption, and after a KV handoff from another engine)."""

from __future__ import annotations

import pytest

from tandem.engine import SamplingParams
from tandem.engine.errors import ModelLoadError
from tests.unit.engine._handoff import copy_blocks
from tests.unit.engine.spec.helpers import prompts, run

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _draft(layers: int = 1, k: int = 3) -> dict:
    return {"speculative_method": "draft", "draft_layers": layers, "num_speculative_tokens": k}


def test_first_layers_draft_equals_plain_in_a_mixed_batch(tiny_dir, make_engine) -> None:
    path = tiny_dir("qwen2", 2)  # q/k/v bias: the draft reuses the target's modules as they are
    plain = make_engine(num_threads=1, model=str(path), num_blocks=128, block_size=4)
    spec = make_engine(num_threads=1, model=str(path), num_blocks=128, block_size=4, **_draft(1))
    ps = prompts([6, 19, 33, 50], seed=7)
    opt_out = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, speculative=False)
    params = [GREEDY, opt_out, GREEDY, opt_out]
    want, _ = run(plain, ps, GREEDY)
    got, chunks = run(spec, ps, params)
    assert got == want
    st = spec.stats()
    assert st.spec_proposed_tokens > 0 and st.spec_num_steps > 0
    assert all(len(c) == 1 for c in chunks[1] + chunks[3])


def test_whole_target_as_draft_accepts_everything(tiny_dir, make_engine) -> None:
    path = tiny_dir("llama", 2)
    plain = make_engine(num_threads=1, model=str(path), num_blocks=128, block_size=4)
    spec = make_engine(num_threads=1, model=str(path), num_blocks=128, block_size=4, **_draft(2, k=4))
    ps = prompts([13, 27], seed=8)
    want, _ = run(plain, ps, GREEDY)
    got, chunks = run(spec, ps, GREEDY)
    assert got == want
    st = spec.stats()
    assert st.spec_acceptance_rate == 1.0
    assert [len(c) for c in chunks[0]] == [1, 5, 5, 5, 5, 3]  # max_tokens caps the lookahead
    assert st.spec_tokens_per_step == pytest.approx(1 + st.spec_accepted_tokens / 10)


def test_separate_checkpoint_draft_and_preemption(tiny_dir, make_engine) -> None:
    path = tiny_dir("llama", 2)
    draft = tiny_dir("llama", 2, num_layers=1, hidden_size=32)
    ps = prompts([30, 34, 38], seed=9)
    g = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    plain = make_engine(num_threads=1, model=str(path), num_blocks=24, block_size=4)
    spec = make_engine(num_threads=1, model=str(path), num_blocks=24, block_size=4,
                       speculative_method="draft", draft_model=str(draft),
                       num_speculative_tokens=3)
    assert run(spec, ps, g)[0] == run(plain, ps, g)[0]
    assert spec.stats().num_preemptions > 0 and spec.stats().spec_proposed_tokens > 0


def test_draft_with_another_vocabulary_is_refused(tiny_dir, make_engine) -> None:
    other = tiny_dir("llama", 2, vocab_size=128)
    with pytest.raises(ModelLoadError, match="vocabulary"):
        make_engine(num_threads=1, model=str(tiny_dir("llama", 2)), num_blocks=16, speculative_method="draft",
                    draft_model=str(other))


def test_draft_builds_its_kv_after_a_handoff(tiny_dir, make_engine) -> None:
    """Decode role: the prompt's KV comes from another engine; the draft prefills its own."""
    path = tiny_dir("llama", 2)
    prefill = make_engine(num_threads=1, model=str(path), num_blocks=64, block_size=4)
    decode = make_engine(num_threads=1, model=str(path), num_blocks=64, block_size=4, **_draft(2, k=3))
    prompt = prompts([29], seed=10)[0]
    want = run(prefill, [prompt], GREEDY)[0][0]
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    rid = prefill.remote.prefill.add(prompt, one, request_id="h")
    first = None
    while prefill.has_unfinished():
        for out in prefill.step():
            first = out.token_ids[0]
    dst = decode.remote.decode.reserve("h", prompt, GREEDY).fill_block_ids
    copy_blocks(prefill, prefill.remote.prefill.held_block_ids(rid), decode, dst)
    prefill.remote.prefill.release(rid)
    tokens = list(decode.remote.decode.commit("h", first).new_token_ids)
    while decode.has_unfinished():
        for out in decode.step():
            tokens += out.new_token_ids
    assert tokens == want
    # a perfect draft accepts all: its KV for the prompt was built here, not shipped
    assert decode.stats().spec_acceptance_rate == 1.0
