"""Hermes format (Hermes 2/3, Qwen2.5, Qwen3): each call is a tagged JSON object::

    Some content.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    ...

A block written as above (the name first, then an ``arguments`` or ``parameters`` object) is
streamed: the call goes out with its name as soon as the name is read, then its arguments as
they are written (tandem/router/tools/parser.py), and the closing tag, when it follows, ends the
block. Any other block is read whole: its JSON object is decoded before the closing tag is
looked for, so a ``</tool_call>`` inside a JSON string does not end the block, and a block that
is not a call is content. A final block whose closing tag was cut off (max_tokens) still counts.
"""

from __future__ import annotations

import re
from json.decoder import scanstring

from tandem.router.tools.call import call_from_object, decode_at
from tandem.router.tools.json_stream import CallHead, Head, read_call_head
from tandem.router.tools.parser import (
    MALFORMED,
    Block,
    BlockToolParser,
    Opened,
    find_tag,
    skip_ws,
)

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
_QUOTE_OR_CLOSE = re.compile('"|' + re.escape(CLOSE))


class HermesToolParser(BlockToolParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks anywhere."""

    name = "hermes"

    def find_open(self, text: str, at_start: bool, final: bool) -> tuple[int, int | None]:
        return find_tag(text, OPEN, final)

    def decide(self, body: str, final: bool) -> Block | Opened | None:
        i = skip_ws(body, 0)
        if i == len(body):
            return MALFORMED if final else None
        if body[i] != "{":
            return MALFORMED
        head = read_call_head(body, i)
        if isinstance(head, CallHead):
            return Opened(head.name, head.start)
        if head is Head.MORE and not final:
            return None
        decoded = decode_at(body, i)
        if decoded is None:
            # Incomplete, or broken: broken for sure once a closing tag shows up outside
            # any JSON string (JSON has no "<" there).
            return MALFORMED if final or _close_outside_string(body, i) else None
        obj, end = decoded
        call = call_from_object(obj)
        if call is None:
            return MALFORMED
        k = skip_ws(body, end)
        if body.startswith(CLOSE, k):
            return Block([call], k + len(CLOSE))
        if CLOSE.startswith(body[k:]):  # nothing, or part of the closing tag, so far
            return Block([call], len(body)) if final else None
        return MALFORMED

    def after_call(self, rest: str, final: bool) -> Block | None:
        k = skip_ws(rest, 0)
        if rest.startswith(CLOSE, k):
            return Block([], k + len(CLOSE))
        if CLOSE.startswith(rest[k:]):  # nothing, or part of the closing tag, so far
            return Block([], len(rest)) if final else None
        return Block([], 0)  # no closing tag: what follows is content


def _close_outside_string(text: str, start: int) -> bool:
    """Whether ``CLOSE`` occurs in ``text[start:]`` outside every JSON string literal."""
    last = text.rfind(CLOSE)
    if last < start:  # the usual case
        return False
    text = text[: last + len(CLOSE)]  # no string scan runs past the last candidate
    pos = start
    while (found := _QUOTE_OR_CLOSE.search(text, pos)) is not None:
        if found.group() == CLOSE:
            return True
        try:
            _, pos = scanstring(text, found.end(), False)  # past the string, at C speed
        except ValueError:  # a string still open (or broken): it runs to the end
            return False
    return False
