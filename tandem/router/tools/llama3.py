"""Llama 3.1 / 3.2 JSON tool calls: the whole output is the calls, optionally after the
``<|python_tag|>`` token, several separated by ``;``::

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": ...}

Only an output that (after leading whitespace) starts with ``{`` or the tag is read as calls;
anything else is all content. An object needs ``name`` and ``parameters`` (or ``arguments``):
a model answering in plain JSON (``{"name": "Ada", "age": 36}``) is not calling a tool.
Text after the last call is content. The tag is a special token: the output must be
detokenized with it kept, or only the ``{`` form is recognized. A call written name first is
streamed as it is written (tandem/router/tools/parser.py); one written otherwise is read whole.
"""

from __future__ import annotations

from tandem.router.tools.call import call_from_object, decode_at
from tandem.router.tools.json_stream import CallHead, Head, read_call_head
from tandem.router.tools.parser import MALFORMED, Block, BlockToolParser, Opened, skip_ws

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(BlockToolParser):
    """``{"name": ..., "parameters": {...}}`` calls at the very start of the output."""

    name = "llama3_json"

    def find_open(self, text: str, at_start: bool, final: bool) -> tuple[int, int | None]:
        if not at_start:
            return len(text), None
        w = skip_ws(text, 0)
        rest = text[w:]
        if rest.startswith(PYTHON_TAG):
            return w, w + len(PYTHON_TAG)
        if rest.startswith("{"):
            return w, w  # the block is the JSON itself: an empty tag
        if not rest or (not final and PYTHON_TAG.startswith(rest)):
            return w, None  # only whitespace (or part of the tag) so far: still at the start
        return len(text), None

    def decide(self, body: str, final: bool) -> Block | Opened | None:
        i = skip_ws(body, 0)
        if body.startswith(";", i):  # a call after the first one
            i = skip_ws(body, i + 1)
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
            return MALFORMED if final else None
        obj, end = decoded
        call = call_from_object(obj, require_arguments=True)
        if call is None:
            return MALFORMED
        k = skip_ws(body, end)
        if k == len(body):  # another call may follow
            return Block([call], end) if final else None
        return Block([call], end, more=body[k] == ";")

    def after_call(self, rest: str, final: bool) -> Block | None:
        k = skip_ws(rest, 0)
        if k == len(rest):  # another call may follow
            return Block([], 0) if final else None
        return Block([], 0, more=rest[k] == ";")
