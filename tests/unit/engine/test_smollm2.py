"""SmolLM2-135M-Instruct (the default model): real text, real tokenizer, exact agreement with
transformers' generate() on a mixed batch of chat and raw prompts of 5 to ~1,500 tokens."""

from __future__ import annotations

import pytest

from tandem.engine import SamplingParams
from tests.data.make_long_prompt import long_prompt
from tests.unit.engine._reference import hf_greedy

pytestmark = pytest.mark.slow

MAX_NEW = 24


@pytest.fixture(scope="module")
def smol(make_engine, smollm2_dir):
    # fp32 so agreement is exact; a small budget so the long prompt is chunked too.
    return make_engine(
        model=str(smollm2_dir), dtype="float32", max_num_batched_tokens=512, num_blocks=512
    )


def _chat(tok, text: str) -> str:
    return tok.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )


def _prompts(tok) -> list[str]:
    return [
        "The capital of France is",
        "def fibonacci(n):",
        _chat(tok, "Write a haiku about the sea."),
        _chat(tok, "Explain in two sentences why the sky is blue."),
        "Once upon a time, in a village at the edge of a great forest, there lived",
        _chat(tok, "List three uses of copper. " * 8),
        long_prompt(40),
        long_prompt(100),
    ]


def test_greedy_batch_matches_transformers(smol) -> None:
    tok = smol.tokenizer
    prompts = _prompts(tok)
    lengths = [len(tok.encode(p)) for p in prompts]
    assert min(lengths) <= 8 and 1200 <= max(lengths) <= 1700, lengths
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    ids = [smol.add_request(p, params) for p in prompts]
    got = {}
    while smol.has_unfinished():
        for out in smol.step():
            if out.finished:
                got[out.request_id] = out
    # The chat prompts share the template's system prompt: later ones hit the prefix cache.
    assert any(got[rid].num_cached_tokens >= 16 for rid in ids)
    for rid, n in zip(ids, lengths, strict=True):
        out = got[rid]
        assert len(out.prompt_token_ids) == n
        assert out.token_ids == hf_greedy(smol.model_path, out.prompt_token_ids, MAX_NEW), rid
        assert out.text == tok.decode(out.token_ids, skip_special_tokens=True)


def test_chat_answer_is_sensible_and_stops_at_eos(smol) -> None:
    prompt = _chat(smol.tokenizer, "What is the capital of France?")
    rid = smol.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=64))
    final = None
    while smol.has_unfinished():
        for out in smol.step():
            if out.finished and out.request_id == rid:
                final = out
    assert final is not None and final.finish_reason == "stop"
    assert "Paris" in final.text


def test_stop_string_truncates_text(smol) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=40, stop=["\n"], ignore_eos=True)
    rid = smol.add_request("def fibonacci(n):", params)
    final = None
    while smol.has_unfinished():
        for out in smol.step():
            if out.finished:
                final = out
    assert final is not None and final.request_id == rid
    assert final.finish_reason == "stop" and final.stop_reason == "\n"
    assert "\n" not in final.text


def test_seeded_text_is_reproducible(smol) -> None:
    params = SamplingParams(temperature=0.8, top_p=0.95, top_k=50, seed=7, max_tokens=20)
    texts = []
    for _ in range(2):
        rid = smol.add_request("Tell me a story about a dragon.", params)
        while smol.has_unfinished():
            for out in smol.step():
                if out.finished and out.request_id == rid:
                    texts.append(out.text)
    assert texts[0] == texts[1] and texts[0]


def test_bf16_engine_runs_and_mostly_agrees(make_engine, smollm2_dir) -> None:
    """bf16 rounding may flip near-ties, so only the first tokens are compared."""
    bf16 = make_engine(model=str(smollm2_dir), dtype="bfloat16", num_blocks=128)
    prompt = "The capital of France is"
    rid = bf16.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    final = None
    while bf16.has_unfinished():
        for out in bf16.step():
            if out.finished:
                final = out
    assert final is not None and final.request_id == rid
    ref = hf_greedy(smollm2_dir, final.prompt_token_ids, 8)
    assert final.token_ids[:3] == ref[:3]
    assert "Paris" in final.text


def test_offline_cli_prints_a_completion() -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "tandem.engine", "--model", "smollm2", "--dtype", "float32",
         "--prompt", "The capital of France is", "--max-tokens", "8", "--threads", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout
