"""Choosing each message's text: worker deltas when sent, router detokenization otherwise."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer, decoders, models

from tandem.common.text.detokenizer import Detokenizer
from tandem.router.request import Chunk
from tandem.router.text_stream import TextStream

# Ids 1..5 decode to "A", "b", "c", "d", "e", glued together with no spaces.
TOKENIZER = Tokenizer(
    models.WordLevel({"<unk>": 0, "A": 1, "b": 2, "c": 3, "d": 4, "e": 5}, unk_token="<unk>")
)
TOKENIZER.decoder = decoders.Fuse()


def _stream(stop: Sequence[str] = ()) -> TextStream:
    return TextStream(Detokenizer(TOKENIZER, [], stop=stop))


def test_router_text_when_worker_sends_none() -> None:
    t = _stream()
    out = [
        t.delta(Chunk([1], leg_start=True)),
        t.delta(Chunk([2])),
        t.delta(Chunk([3], finished=True)),
    ]
    assert out == ["A", "b", "c"]


def test_worker_text_including_the_first_token_is_not_repeated() -> None:
    t = _stream()
    out = [
        t.delta(Chunk([1], leg_start=True)),
        t.delta(Chunk([2], text="Ab")),
        t.delta(Chunk([3], text="")),  # held back by the worker: nothing from the router either
        t.delta(Chunk([4], text="cd", finished=True)),
    ]
    assert out == ["A", "b", "", "cd"]


def test_new_leg_restarts_the_worker_text() -> None:
    t = _stream()
    first_leg = [t.delta(Chunk([1], leg_start=True)), t.delta(Chunk([2], text="Ab"))]
    second_leg = [
        t.delta(Chunk([3], leg_start=True)),
        t.delta(Chunk([4], text="cd", finished=True)),
    ]
    assert first_leg + second_leg == ["A", "b", "c", "d"]


def test_router_stop_string_cut_when_worker_sends_no_text() -> None:
    t = _stream(stop=["cd"])
    out = [
        t.delta(Chunk([1], leg_start=True)),
        t.delta(Chunk([2])),
        t.delta(Chunk([3])),
        t.delta(Chunk([4], finished=True, finish_reason="stop")),
    ]
    assert "".join(out) == "Ab" and t.stop_reason == "cd"
