"""The interface of free-form (``tool_choice: "auto"``) output parsers, and the block engine
the formats share.

An output is content with call *blocks* in it::

    content  <open tag> body  content  <open tag> body ...
             '-- find_open -''- decide: the calls in it, how much of the body it took

A format answers two questions about a growing buffer, and answers None ("not yet") only
while more text could change its answer; an answer it gives for a prefix must hold for every
longer text. ``parse`` is then "stream the whole text, then finish", so the streamed and the
parsed output cannot disagree, however the text was split.

Content whitespace rule: the content is the text outside well-formed blocks, joined and
stripped once (``str.strip``); streamed content concatenates to exactly that, because leading
whitespace is dropped and a trailing whitespace run is held until more content follows.
A malformed block is content, verbatim: its tag is emitted and the body is scanned again.

Streamed calls: ``decide`` may answer ``Opened`` as soon as a call's name is known (its head,
tandem/router/tools/json_stream.py): the call's id and name go out at once, then its arguments as
they are written (checked and minified by a JsonScanner), then the rest of the call object,
then ``after_call`` reads what closes the block. From ``Opened`` on the call stands: arguments
cut off (max_tokens) or broken JSON end where they end or break, and what follows the break
is read by ``after_call``; a client must check the arguments anyway (OpenAI says as much).
Calls written otherwise (the name after the arguments, arguments as a JSON string) are read
whole by ``decide``, and a malformed one is content as above.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from tandem.router.tools.call import (
    CallDelta,
    ContentDelta,
    ParsedOutput,
    ToolDelta,
    collect,
    new_call_id,
)
from tandem.router.tools.json_stream import DONE, OPEN, JsonScanner


class StreamingToolParser(ABC):
    """Turns one output's text deltas into content and call deltas, in order."""

    @abstractmethod
    def feed(self, delta: str) -> list[ToolDelta]:
        """What ``delta`` settles; text that may still open a call is held back."""

    @abstractmethod
    def finish(self) -> list[ToolDelta]:
        """Everything still held, once the output has ended."""


class ToolParser(ABC):
    """A model family's tool-call format: whole outputs (``parse``) or streams."""

    name: str

    @abstractmethod
    def parse(self, text: str) -> ParsedOutput:
        """Split a finished output into content and calls; a malformed call stays content."""

    @abstractmethod
    def streaming(self) -> StreamingToolParser:
        """A fresh parser for one streamed output."""


@dataclass(frozen=True, slots=True)
class Block:
    """A settled block: its calls as ``(name, arguments JSON)`` (None: malformed, so its tag
    is content and its body is scanned again), the body characters it took, and whether
    another block follows directly with no tag (Llama's ``;``)."""

    calls: list[tuple[str, str]] | None
    end: int
    more: bool = False


MALFORMED = Block(None, 0)


@dataclass(frozen=True, slots=True)
class Opened:
    """A call whose name is known and whose arguments object starts at ``body[start]``, to be
    streamed. ``wrapped``: the arguments sit inside a call object (``{"name": ..., "arguments":
    {...}}``) whose rest is read after them."""

    name: str
    start: int
    wrapped: bool = True


class BlockToolParser(ToolParser):
    """A ToolParser built from ``find_open`` and ``decide`` (see the module docstring)."""

    @abstractmethod
    def find_open(self, text: str, at_start: bool, final: bool) -> tuple[int, int | None]:
        """``(safe, body)``: ``text[:safe]`` is content whatever follows; when a block opens,
        ``text[safe:body]`` is its tag (it may be empty only where ``at_start`` is required,
        which guarantees progress). ``at_start``: nothing but whitespace came before. When
        ``final`` and no block opens, ``safe`` is ``len(text)``."""

    @abstractmethod
    def decide(self, body: str, final: bool) -> Block | Opened | None:
        """The block ``body`` starts with, or the streamed call it opens; None only when not
        ``final`` and still open."""

    def after_call(self, rest: str, final: bool) -> Block | None:
        """What closes a streamed call's block in ``rest`` (the text after its call object,
        or from where its JSON broke): a Block without calls saying how much it takes and
        whether another block follows; None only when not ``final`` and still open. By
        default nothing: the block ends with the call."""
        return Block([], 0)

    def parse(self, text: str) -> ParsedOutput:
        stream = self.streaming()
        return collect(stream.feed(text) + stream.finish())

    def streaming(self) -> StreamingToolParser:
        return _BlockStream(self)


@dataclass(slots=True)
class _Streaming:
    """The call ``_BlockStream`` is streaming: its index, the scanner of its arguments while
    they are read, then (``wrapped``) the scanner of the rest of its call object."""

    index: int
    arguments: JsonScanner | None
    wrapped: bool
    rest: JsonScanner | None = None


class _BlockStream(StreamingToolParser):
    def __init__(self, parser: BlockToolParser) -> None:
        self._parser = parser
        self._buf = ""  # outside: a possible partial tag; inside: the undecided body
        self._inside = False
        self._tag = ""  # the tag that opened the current block
        self._at_start = True
        self._index = 0  # next call index
        self._call: _Streaming | None = None  # the call being streamed
        self._started = False  # content gate: some non-whitespace content went out
        self._held = ""  # content gate: trailing whitespace not yet known to be inside

    def feed(self, delta: str) -> list[ToolDelta]:
        self._buf += delta
        return self._run(final=False)

    def finish(self) -> list[ToolDelta]:
        return self._run(final=True)

    def _run(self, final: bool) -> list[ToolDelta]:
        out: list[ToolDelta] = []
        while True:
            if self._call is not None:
                if not self._stream_call(final, out):
                    return out
                continue
            if not self._inside:
                safe, body = self._parser.find_open(self._buf, self._at_start, final)
                self._content(self._buf[:safe], out)
                if body is None:
                    self._buf = self._buf[safe:]
                    return out
                self._tag, self._buf, self._inside = self._buf[safe:body], self._buf[body:], True
            block = self._parser.decide(self._buf, final)
            if block is None:
                if final:  # a format bug: a finished output must settle
                    raise RuntimeError(f"{self._parser.name}: a final block was left open")
                return out
            self._at_start = False
            if isinstance(block, Opened):
                out.append(CallDelta(self._index, new_call_id(), block.name, ""))
                self._call = _Streaming(self._index, JsonScanner(), block.wrapped)
                self._index += 1
                self._buf = self._buf[block.start :]
                continue
            if block.calls is None:
                self._content(self._tag + self._buf[: block.end], out)
            for name, arguments in block.calls or ():
                out.append(CallDelta(self._index, new_call_id(), name, ""))
                out.append(CallDelta(self._index, None, None, arguments))
                self._index += 1
            self._end_block(block)

    def _stream_call(self, final: bool, out: list[ToolDelta]) -> bool:
        """Read on in the streamed call; whether its block is over (False: needs more)."""
        call = self._call
        assert call is not None
        if call.arguments is not None:
            scanner = call.arguments
            self._buf = self._buf[scanner.feed(self._buf) :]
            if piece := scanner.take():
                out.append(CallDelta(call.index, None, None, piece))
            if scanner.state == OPEN and not final:
                return False
            call.arguments = None
            if scanner.state == DONE and call.wrapped:
                call.rest = JsonScanner(in_object=True)
        if call.rest is not None:  # the call object's other keys and its "}": not sent
            scanner = call.rest
            self._buf = self._buf[scanner.feed(self._buf) :]
            scanner.take()
            if scanner.state == OPEN and not final:
                return False
            call.rest = None
        block = self._parser.after_call(self._buf, final)
        if block is None:
            return False
        self._call = None
        self._end_block(block)
        return True

    def _end_block(self, block: Block) -> None:
        self._buf = self._buf[block.end :]
        self._inside = block.more and block.calls is not None
        self._tag = ""

    def _content(self, text: str, out: list[ToolDelta]) -> None:
        # Concatenated output == all outside text joined, then str.strip()-ed.
        if text.strip():
            self._at_start = False
        if not self._started:
            text = text.lstrip()
            if not text:
                return
            self._started = True
        text = self._held + text
        body = text.rstrip()
        self._held = text[len(body) :]
        if body:
            out.append(ContentDelta(body))


def skip_ws(text: str, i: int) -> int:
    """The index of the first non-whitespace character at or after ``i`` (or ``len(text)``)."""
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def find_tag(text: str, tag: str, final: bool) -> tuple[int, int | None]:
    """``find_open`` for a literal tag anywhere: hold back a suffix that may start the tag."""
    at = text.find(tag)
    if at >= 0:
        return at, at + len(tag)
    if not final:
        for k in range(min(len(tag) - 1, len(text)), 0, -1):
            if text.endswith(tag[:k]):
                return len(text) - k, None
    return len(text), None
