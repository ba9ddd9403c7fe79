"""Incremental detokenization with stop strings, on a fake byte-level decoder and SmolLM2."""

from __future__ import annotations

from collections.abc import Sequence

from router.detokenizer import Detokenizer
from router.tokenizer import RouterTokenizer

# A fake vocabulary: each id is some bytes; decoding is lossy (U+FFFD) for split characters.
VOCAB = {1: b"Hel", 2: b"lo", 3: b" wor", 4: b"ld", 5: b"\xe2\x82", 6: b"\xac", 7: b"!", 8: b"\n"}


def fake_decode(ids: Sequence[int]) -> str:
    return b"".join(VOCAB[i] for i in ids).decode("utf-8", errors="replace")


def _run(
    ids: list[int], stop: Sequence[str] = (), include: bool = False
) -> tuple[list[str], Detokenizer]:
    d = Detokenizer(fake_decode, [], stop, include)
    deltas = [d.add([i]) for i in ids]
    deltas.append(d.flush())
    return deltas, d


def test_deltas_concatenate_to_the_text() -> None:
    deltas, d = _run([1, 2, 3, 4, 7])
    assert "".join(deltas) == "Hello world!" == d.text


def test_split_multibyte_character_waits_for_its_last_byte() -> None:
    deltas, _ = _run([1, 5, 6, 7])
    assert deltas == ["Hel", "", "€", "!", ""]


def test_stop_string_cut_and_never_emitted() -> None:
    deltas, d = _run([1, 2, 3, 4, 7], stop=["o wo"])
    assert "".join(deltas) == "Hell" and d.stop_reason == "o wo"
    assert all("o" not in x for x in deltas)


def test_stop_string_included_on_request() -> None:
    deltas, d = _run([1, 2, 3, 4, 7], stop=["wor"], include=True)
    assert "".join(deltas) == "Hello wor" and d.stop_reason == "wor"


def test_held_back_prefix_released_when_it_cannot_match() -> None:
    deltas, d = _run([1, 2, 7], stop=["lo!x"])
    assert deltas == ["He", "l", "", "lo!"] and d.stop_reason is None


def test_tokens_after_stop_are_ignored() -> None:
    d = Detokenizer(fake_decode, [], ["\n"])
    assert d.add([1, 8, 2, 3]) == "Hel"
    assert d.flush() == "" and d.text == "Hel"


def test_real_tokenizer_incremental_equals_full_decode(tokenizer: RouterTokenizer) -> None:
    text = "Hello there! Ünïcödé ✓ — 你好, world.\n  Indented."
    prompt = tokenizer.encode("Say:")
    ids = tokenizer.encode(text, add_special_tokens=False)
    d = Detokenizer(tokenizer.decode, prompt)
    out = "".join(d.add([i]) for i in ids) + d.flush()
    assert out == tokenizer.decode(ids)
