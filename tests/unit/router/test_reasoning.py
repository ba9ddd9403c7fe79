"""The reasoning parsers on recorded outputs (Qwen3, Qwen3 with thinking off, DeepSeek-R1 and
R1-0528), whole and streamed in every split: the thinking and the answer come out the same
however the text arrives, and no marker reaches either."""

from __future__ import annotations

import random

import pytest

from tandem.router.reasoning import PARSERS

QWEN3_PROMPT = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
QWEN3_OFF_PROMPT = QWEN3_PROMPT + "<think>\n\n</think>\n\n"  # enable_thinking: false
R1_PROMPT = "<｜User｜>What is 2+2?<｜Assistant｜><think>\n"  # the template opens it

# (parser, prompt, recorded output, expected reasoning, expected answer)
CASES = [
    ("qwen3", QWEN3_PROMPT,
     "<think>\nThe user asks for 2+2, which is 4.\n</think>\n\nThe answer is **4**.",
     "\nThe user asks for 2+2, which is 4.\n", "\n\nThe answer is **4**."),
    ("qwen3", QWEN3_PROMPT, "\n<think>Short.</think>4", "Short.", "4"),
    ("qwen3", QWEN3_PROMPT, "The answer is 4.", "", "The answer is 4."),
    ("qwen3", QWEN3_PROMPT, "<thin", "", "<thin"),  # cut off inside a would-be tag
    ("qwen3", QWEN3_PROMPT, "<think>\nStill thinking when the budget ran out",
     "\nStill thinking when the budget ran out", ""),
    ("qwen3", QWEN3_OFF_PROMPT, "4. Tags look like <think>x</think>.",
     "", "4. Tags look like <think>x</think>."),
    ("qwen3", R1_PROMPT, "2+2 is 4.\n</think>\n\n4", "2+2 is 4.\n", "\n\n4"),
    ("deepseek_r1", R1_PROMPT, "Okay, 2+2: that is 4.\n</think>\n\n**4**",
     "Okay, 2+2: that is 4.\n", "\n\n**4**"),
    ("deepseek_r1", "<｜Assistant｜>", "<think>\nOkay, 4.\n</think>\n\n4", "\nOkay, 4.\n",
     "\n\n4"),  # R1-0528 writes the opening tag itself
    ("deepseek_r1", "<｜Assistant｜>", "Okay, 4.</think>4", "Okay, 4.", "4"),
    ("deepseek_r1", R1_PROMPT, "Thinking, and never done", "Thinking, and never done", ""),
    ("deepseek_r1", R1_PROMPT, "</think>", "", ""),
    ("deepseek_r1", R1_PROMPT, "a </thin b </think>c </think>", "a </thin b ", "c </think>"),
    ("deepseek_r1", R1_PROMPT + "\n\n</think>\n\n", "Just 4.", "", "Just 4."),
]


def _run(parser: str, prompt: str, pieces: list[str]) -> tuple[str, str, list[tuple[str, str]]]:
    stream = PARSERS[parser].stream(prompt[-40:])
    deltas = [stream.feed(p) for p in pieces]
    deltas.append(stream.finish())
    return "".join(r for r, _ in deltas), "".join(a for _, a in deltas), deltas


@pytest.mark.parametrize(("parser", "prompt", "output", "reasoning", "answer"), CASES)
def test_whole_output(parser: str, prompt: str, output: str, reasoning: str,
                      answer: str) -> None:
    got_reasoning, got_answer, _ = _run(parser, prompt, [output])
    assert (got_reasoning, got_answer) == (reasoning, answer)


@pytest.mark.parametrize(("parser", "prompt", "output", "reasoning", "answer"), CASES)
def test_streamed_in_every_two_way_split_and_char_by_char(
    parser: str, prompt: str, output: str, reasoning: str, answer: str,
) -> None:
    splits = [[output[:i], output[i:]] for i in range(len(output) + 1)]
    splits.append(list(output))
    for pieces in splits:
        got_reasoning, got_answer, _ = _run(parser, prompt, pieces)
        assert (got_reasoning, got_answer) == (reasoning, answer), pieces


@pytest.mark.parametrize(("parser", "prompt", "output", "reasoning", "answer"), CASES)
def test_streamed_in_random_pieces(parser: str, prompt: str, output: str, reasoning: str,
                                   answer: str) -> None:
    rng = random.Random(len(output))
    for _ in range(50):
        cuts = sorted(rng.sample(range(len(output) + 1), min(4, len(output) + 1)))
        pieces = [output[a:b] for a, b in zip([0, *cuts], [*cuts, len(output)], strict=True)]
        assert _run(parser, prompt, pieces)[:2] == (reasoning, answer), pieces


def test_nothing_is_held_longer_than_a_marker_could_need() -> None:
    """Text that cannot begin a marker goes out with the delta that brought it."""
    stream = PARSERS["deepseek_r1"].stream(R1_PROMPT)
    assert stream.feed("Okay, 2+2") == ("Okay, 2+2", "")
    assert stream.feed(" is 4 <") == (" is 4 ", "")  # "<" may open "</think>"
    assert stream.feed("/thi") == ("", "")
    assert stream.feed("nk>\n\nFour") == ("", "\n\nFour")
    assert stream.answering
    assert stream.feed(" more") == ("", " more")
    assert stream.finish() == ("", "")


def test_qwen3_decides_at_the_first_text_that_is_not_the_tag() -> None:
    stream = PARSERS["qwen3"].stream(QWEN3_PROMPT)
    assert stream.feed("\n") == ("", "")  # whitespace before a possible tag
    assert stream.feed("<th") == ("", "")
    assert stream.feed("is is not a tag") == ("", "\n<this is not a tag")
    assert stream.answering


def test_the_prompt_decides_where_the_output_starts() -> None:
    assert PARSERS["qwen3"].stream(QWEN3_OFF_PROMPT).answering
    assert not PARSERS["qwen3"].stream(QWEN3_PROMPT).answering
    assert not PARSERS["deepseek_r1"].stream(R1_PROMPT).answering


def test_a_constrained_output_is_all_answer() -> None:
    """A grammar writes the whole output (structured outputs, forced tool calls): no thinking
    to split off, even after a template that opened it."""
    stream = PARSERS["deepseek_r1"].stream(R1_PROMPT, constrained=True)
    assert stream.answering and stream.feed('{"a": 1}') == ("", '{"a": 1}')
