"""The detokenizer core: a small in-memory byte-level tokenizer, plus SmolLM2's for real text."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models

from tandem.common.text.detokenizer import Detokenizer

FFFD = "\ufffd"
# Each id decodes to these bytes; 4 + 5 is "€" split in two, 10 is a lone continuation byte.
PIECES = [b"Hel", b"lo", b" wor", b"ld", b"\xe2\x82", b"\xac", b"!", b"\n", b"S", b"TOP", b"\x80"]
HEL, LO, WOR, LD, EURO_A, EURO_B, BANG, NL, S, TOP, CONT = range(len(PIECES))
END = len(PIECES)  # the special token <|end|>


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what a ByteLevel vocabulary is spelled in)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _byte_tokenizer(pieces: Sequence[bytes]) -> Tokenizer:
    spell = _bytes_to_unicode()
    vocab = {"".join(spell[b] for b in piece): i for i, piece in enumerate(pieces)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|end|>"])
    return tok


TOK = _byte_tokenizer(PIECES)


def _run(
    ids: Sequence[int],
    prompt: Sequence[int] = (),
    stop: Sequence[str] = (),
    include_stop: bool = False,
    min_tokens: int = 0,
    skip_special_tokens: bool = True,
) -> tuple[list[str], Detokenizer]:
    """Feed ids one by one; return (deltas + [flush()], the detokenizer)."""
    d = Detokenizer(
        TOK, prompt, skip_special_tokens=skip_special_tokens, stop=stop,
        include_stop=include_stop, min_tokens=min_tokens,
    )
    deltas = [d.add([i]) for i in ids]
    deltas.append(d.flush())
    assert "".join(deltas) == d.text
    return deltas, d


def test_deltas_concatenate_to_the_text() -> None:
    deltas, d = _run([HEL, LO, WOR, LD, BANG])
    assert deltas == ["Hel", "lo", " wor", "ld", "!", ""] and d.text == "Hello world!"


def test_split_multibyte_character_waits_for_its_last_byte() -> None:
    deltas, _ = _run([HEL, EURO_A, EURO_B, BANG])
    assert deltas == ["Hel", "", "€", "!", ""]


def test_split_character_at_the_end_is_flushed_as_replacement() -> None:
    deltas, d = _run([HEL, EURO_A])
    assert deltas == ["Hel", "", FFFD] and d.text == "Hel" + FFFD


def test_stop_string_spanning_tokens_is_cut_and_never_emitted() -> None:
    deltas, d = _run([HEL, LO, WOR, LD, BANG], stop=["o wo"])
    assert "".join(deltas) == "Hell" and d.stop_reason == "o wo"
    assert deltas == ["Hel", "l", "", "", "", ""]


def test_stop_string_included_on_request_holds_nothing_back() -> None:
    deltas, d = _run([HEL, LO, WOR, LD, BANG], stop=["wor"], include_stop=True)
    assert deltas == ["Hel", "lo", " wor", "", "", ""] and d.stop_reason == "wor"
    deltas, _ = _run([HEL, LO, BANG], stop=["lo!x"], include_stop=True)
    assert deltas == ["Hel", "lo", "!", ""]


def test_held_back_prefix_is_released_when_it_cannot_match() -> None:
    deltas, d = _run([HEL, LO, BANG], stop=["lo!x"])
    assert deltas == ["He", "l", "", "lo!"] and d.stop_reason is None


def test_stop_string_after_a_split_character() -> None:
    deltas, d = _run([S, EURO_A, EURO_B, TOP, BANG], stop=["€TOP"])
    assert "".join(deltas) == "S" and d.stop_reason == "€TOP"


def test_tokens_after_stop_are_ignored() -> None:
    d = Detokenizer(TOK, [], stop=["\n"])
    assert d.add([HEL, NL, LO, WOR]) == "Hel"
    assert d.add([LO]) == "" and d.flush() == "" and d.text == "Hel"


def test_stops_wait_for_min_tokens() -> None:
    # "lo" in the 2nd token is not looked for; the one in the 4th is.
    deltas, d = _run([HEL, LO, HEL, LO], stop=["lo"], min_tokens=2)
    assert "".join(deltas) == "HelloHel" and d.stop_reason == "lo"
    # A match may start in the first min_tokens tokens (that text is held back meanwhile).
    deltas, d = _run([HEL, LO], stop=["ello"], min_tokens=1)
    assert deltas == ["H", "", ""] and d.stop_reason == "ello"


def test_skip_special_tokens() -> None:
    assert _run([HEL, END, LO])[1].text == "Hello"
    assert _run([HEL, END, LO], skip_special_tokens=False)[1].text == "Hel<|end|>lo"


def test_prompt_gives_left_context_but_none_of_its_text() -> None:
    deltas, _ = _run([LO, BANG], prompt=[HEL, WOR, HEL])
    assert deltas == ["lo", "!", ""]
    # A prompt ending inside a character (a token-id prompt can): none of the prompt's text
    # leaks out, and the byte that completes its last character shows nothing.
    deltas, _ = _run([EURO_B, BANG, LO], prompt=[HEL, EURO_A])
    assert deltas == ["", "!", "lo", ""]


def test_a_decoder_whose_text_is_not_prefix_stable_does_not_break_the_stream() -> None:
    # Fuse + Replace: "a" then "ab" reads "X", which does not start with "a" (DecodeStream
    # refuses that); the core falls back to decoding with left context by hand.
    tok = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1, "b": 2, "c": 3}, unk_token="<unk>"))
    tok.decoder = decoders.Sequence([decoders.Fuse(), decoders.Replace("ab", "X")])
    d = Detokenizer(tok, [])
    deltas = [d.add([t]) for t in (1, 2, 3, 1, 3)] + [d.flush()]
    assert "".join(deltas) == d.text and d.text.endswith("ac")


def test_list_and_one_by_one_agree() -> None:
    ids = [HEL, EURO_A, EURO_B, LO, WOR, S, TOP, LD]
    one = Detokenizer(TOK, [], stop=["STOP"])
    many = Detokenizer(TOK, [], stop=["STOP"])
    assert "".join(one.add([i]) for i in ids) == many.add(ids) == "Hel€lo wor"
    assert one.stop_reason == many.stop_reason == "STOP"


# -- properties -------------------------------------------------------------------------------
OUTPUT = st.lists(st.sampled_from(range(len(PIECES))), max_size=12)
# Prompts end on whole characters (no prompt-and-output character), as a text prompt does.
PROMPT = st.lists(st.sampled_from([HEL, LO, WOR, BANG, NL, S, TOP, END]), max_size=8)


@settings(max_examples=200, deadline=None)
@given(OUTPUT, PROMPT, st.data())
def test_stream_equals_whole_decode_cut_at_the_first_stop(
    ids: list[int], prompt: list[int], data: st.DataObject
) -> None:
    whole = TOK.decode(ids)
    stops = data.draw(st.lists(st.sampled_from(_substrings(whole) or ["zz"]), max_size=2))
    include = data.draw(st.booleans())
    deltas, d = _run(ids, prompt, stop=stops, include_stop=include)
    cut, stop = _first_match(whole, stops)
    if stop is None:
        assert d.text == whole and d.stop_reason is None
    else:
        assert d.text == (whole[:cut + len(stop)] if include else whole[:cut])
        assert d.stop_reason == stop


@settings(max_examples=200, deadline=None)
@given(OUTPUT, st.lists(st.sampled_from(["lo", "o w", "€T", "l", "STOP!"]), max_size=2),
       st.booleans())
def test_text_lags_the_decoded_text_by_less_than_a_stop(
    ids: list[int], stops: list[str], include: bool
) -> None:
    hold = 0 if include else max((len(s) for s in stops), default=1) - 1
    d = Detokenizer(TOK, [], stop=stops, include_stop=include)
    for n, i in enumerate(ids, start=1):
        d.add([i])
        if d.stop_reason is not None:
            break
        done = TOK.decode(ids[:n]).rstrip(FFFD)  # a character still split is not out yet
        assert done.startswith(d.text) and len(done) - len(d.text) <= hold


def _substrings(text: str) -> list[str]:
    return [text[i:j] for i in range(len(text)) for j in range(i + 1, min(len(text), i + 4) + 1)]


def _first_match(text: str, stops: Sequence[str]) -> tuple[int, str | None]:
    """Where the first-ending match starts (of two ending together, the longer one)."""
    best: tuple[int, int, str] | None = None
    for s in stops:
        i = text.find(s)
        if i != -1 and (best is None or (i + len(s), i) < best[:2]):
            best = (i + len(s), i, s)
    return (best[1], best[2]) if best is not None else (0, None)


# -- the real tokenizer -----------------------------------------------------------------------
def test_smollm2_incremental_equals_full_decode(smollm2_dir: Path) -> None:
    tok = Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))
    text = "Hello there! Ünïcödé ✓ — 你好, world.\n  Indented. 👍🏽"
    prompt = tok.encode("Say:", add_special_tokens=False).ids
    ids = tok.encode(text, add_special_tokens=False).ids
    d = Detokenizer(tok, prompt)
    deltas = [d.add([i]) for i in ids]
    assert "".join(deltas) + d.flush() == tok.decode(ids) == text == d.text
    assert not any(FFFD in x for x in deltas)
    assert deltas[0] == "Hello"
    d = Detokenizer(tok, prompt)
    assert d.add(tok.encode(" there", add_special_tokens=False).ids) == " there"
