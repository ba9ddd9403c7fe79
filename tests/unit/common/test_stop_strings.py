"""Stop-string matching and hold-back over plain text chunks (no tokenizer)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.common.text.stop_strings import StopStrings


def _feed(chunks: Sequence[str], stops: Sequence[str], include: bool = False) -> StopStrings:
    s = StopStrings(stops, include)
    deltas = [s.add(c) for c in chunks] + [s.flush()]
    assert "".join(deltas) == s.text
    return s


def _oracle(text: str, stops: Sequence[str], include: bool) -> tuple[str, str | None]:
    """The whole text cut at the first-ending match (of two ending together, the longer)."""
    best: tuple[int, int, str] | None = None
    for stop in stops:
        begin = text.find(stop) if stop else -1
        if begin != -1 and (best is None or (begin + len(stop), begin) < best[:2]):
            best = (begin + len(stop), begin, stop)
    if best is None:
        return text, None
    end, begin, stop = best
    return text[: end if include else begin], stop


def test_stop_string_spanning_chunks_is_cut_and_never_emitted() -> None:
    s = StopStrings(["END"])
    assert [s.add("so E"), s.add("N"), s.add("D then")] == ["so ", "", ""]
    assert s.text == "so " and s.stop_reason == "END" and s.done


def test_included_stop_string_is_kept_and_nothing_is_held() -> None:
    s = StopStrings(["END"], include_stop=True)
    assert [s.add("so E"), s.add("N"), s.add("D then")] == ["so E", "N", "D"]
    assert s.text == "so END" and s.stop_reason == "END"


def test_held_back_prefix_is_released_when_it_cannot_match() -> None:
    s = StopStrings(["lo!x"])
    assert [s.add("Hel"), s.add("lo"), s.add("!")] == ["He", "l", ""]
    assert s.add("?") == "lo!?" and s.stop_reason is None


def test_flush_releases_what_is_held_and_ends_the_stream() -> None:
    s = StopStrings(["STOP"])
    assert s.add("wait ST") == "wait " and s.flush() == "ST"
    assert s.add("OP") == "" and s.text == "wait ST" and s.stop_reason is None


def test_first_ending_match_wins() -> None:
    # "bc" ends before "abcd" does, though "abcd" starts first: same as one char at a time.
    assert _feed(["abcd"], ["abcd", "bc"]).text == "a"
    assert _feed(list("abcd"), ["abcd", "bc"]).text == "a"
    # Two matches ending together: the longer (earlier) one.
    s = _feed(["xANSW"], ["SW", "ANSW"])
    assert s.text == "x" and s.stop_reason == "ANSW"


def test_unsearched_chunk_can_start_but_not_end_a_match() -> None:
    s = StopStrings(["ab"])
    assert s.add("xab", search=False) == "xab"  # "ab" ends here but is not looked for
    assert s.add("b") == "b" and s.stop_reason is None  # "abb": no match ends in "b"
    s = StopStrings(["abc"])
    assert s.add("xab", search=False) == "x" and s.add("c") == "" and s.stop_reason == "abc"


def test_empty_stop_strings_are_ignored_and_a_string_is_one_stop() -> None:
    assert _feed(["abc"], ["", ""]).text == "abc"
    s = _feed(["abc"], "bc")
    assert s.text == "a" and s.stop_reason == "bc"


# -- properties -------------------------------------------------------------------------------
TEXT = st.text(alphabet="ab c", max_size=30)
STOPS = st.lists(st.text(alphabet="ab c", min_size=1, max_size=4), max_size=3)


def _split(text: str, cuts: list[int]) -> list[str]:
    at = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[i:j] for i, j in pairwise(at)]


@settings(max_examples=300, deadline=None)
@given(TEXT, STOPS, st.booleans(), st.lists(st.integers(0, 30), max_size=8))
def test_any_chunking_gives_the_oracle(
    text: str, stops: list[str], include: bool, cuts: list[int]
) -> None:
    expected = _oracle(text, stops, include)
    for chunks in (_split(text, cuts), list(text), [text]):
        s = _feed(chunks, stops, include)
        assert (s.text, s.stop_reason) == expected


@settings(max_examples=300, deadline=None)
@given(TEXT, STOPS, st.booleans(), st.lists(st.integers(0, 30), max_size=8))
def test_emitted_text_is_final_and_lags_by_less_than_a_stop(
    text: str, stops: list[str], include: bool, cuts: list[int]
) -> None:
    final, _ = _oracle(text, stops, include)
    hold = 0 if include else max((len(x) for x in stops), default=1) - 1
    s = StopStrings(stops, include)
    seen = ""
    for chunk in _split(text, cuts):
        s.add(chunk)
        seen += chunk
        assert final.startswith(s.text)  # never handed out and then cut off
        if not s.done:
            assert len(seen) - len(s.text) <= hold
