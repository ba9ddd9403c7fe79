"""A reasoning model's thinking, split from its answer (``--reasoning-parser``, as vLLM's).

    output text deltas ──ReasoningStream.feed──> (reasoning delta, answer delta)
                                                  answer only ──> tool parsing, ``content``

Both parsers read ``<think> ... </think>``; where the output starts is read off the end of the
rendered prompt, so one parser serves every template of its family:

    prompt ends with   the output starts          e.g.
    "<think>"          inside the thinking        DeepSeek-R1, Qwen3.5 (the template opens it)
    "</think>"         in the answer              Qwen3 with enable_thinking: false
    anything else      qwen3: in the answer unless it opens with <think> (whitespace before
                       it is dropped); deepseek_r1: inside the thinking (a leading <think>,
                       as R1-0528 writes, is dropped)

An output that never closes its thinking is all reasoning (a budget spent thinking); one that
never opens it (qwen3) is all answer. A constrained output (a structured output, a required or
named tool call) constrains the answer alone: its grammar starts after the end marker's token
(tandem/router/reasoning_grammar.py), so the thinking is read as any other; only a grammar
that covers the whole output (the prompt closed the thinking, or the marker is no single
token) makes it all answer. Text that may be the start of a marker split across deltas is
held back until the next delta settles it (at most ``len(marker) - 1`` characters), so no
marker ever reaches the client, and nothing else is delayed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class _State(Enum):
    LEAD = "lead"  # before the output's first text: an opening tag may come
    THINKING = "thinking"
    ANSWER = "answer"


@dataclass(frozen=True, slots=True)
class ReasoningParser:
    """One model family's thinking markers. ``implicit_start``: its output starts inside the
    thinking even when the prompt does not show the opening tag (DeepSeek-R1's template
    opens it; older releases' outputs then carry only the closing tag)."""

    name: str
    implicit_start: bool
    start: str = "<think>"
    end: str = "</think>"

    def stream(self, prompt_tail: str, constrained: bool = False) -> ReasoningStream:
        """A splitter for one output of a prompt ending with ``prompt_tail`` (a few of its
        last tokens' text are enough); ``constrained``: a grammar writes the whole output."""
        tail = prompt_tail.rstrip()
        if constrained or tail.endswith(self.end):
            return ReasoningStream(self, _State.ANSWER)
        if tail.endswith(self.start):
            return ReasoningStream(self, _State.THINKING)
        return ReasoningStream(self, _State.LEAD)


PARSERS: dict[str, ReasoningParser] = {
    "qwen3": ReasoningParser("qwen3", implicit_start=False),
    "deepseek_r1": ReasoningParser("deepseek_r1", implicit_start=True),
}


class ReasoningStream:
    """Splits one output's text deltas into reasoning and answer (see the module docstring)."""

    def __init__(self, parser: ReasoningParser, state: _State) -> None:
        self._parser = parser
        self._state = state
        self._held = ""  # text not yet given out: a marker's possible beginning

    @property
    def answering(self) -> bool:
        """Whether the thinking is over (or never began): later text is all answer."""
        return self._state is _State.ANSWER

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, answer) that ``text`` settles."""
        if self._state is _State.ANSWER:
            return "", text
        self._held += text
        if self._state is _State.LEAD:
            if not self._lead():
                return "", ""
            if self._state is _State.ANSWER:
                answer, self._held = self._held, ""
                return "", answer
        return self._thinking()

    def finish(self) -> tuple[str, str]:
        """(reasoning, answer) still held back at the end of the output."""
        held, self._held = self._held, ""
        if self._state is _State.ANSWER or (self._state is _State.LEAD
                                            and not self._parser.implicit_start):
            return "", held
        return held, ""

    def _lead(self) -> bool:
        """Settle the output's beginning; False while it may still be the opening tag."""
        start = self._parser.start
        body = self._held.lstrip()
        if body.startswith(start):
            self._held = body[len(start):]
            self._state = _State.THINKING
            return True
        if start.startswith(body):  # empty, whitespace, or a piece of the tag so far
            return False
        self._state = _State.THINKING if self._parser.implicit_start else _State.ANSWER
        return True

    def _thinking(self) -> tuple[str, str]:
        end = self._parser.end
        at = self._held.find(end)
        if at >= 0:
            thought, answer = self._held[:at], self._held[at + len(end):]
            self._held = ""
            self._state = _State.ANSWER
            return thought, answer
        keep = _partial_suffix(self._held, end)
        cut = len(self._held) - keep
        thought, self._held = self._held[:cut], self._held[cut:]
        return thought, ""


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that begins ``marker`` (shorter than it)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
