"""Llama 3.1 / 3.2 JSON tool calls: the whole output is the calls, optionally after the
``<|python_tag|>`` token, several separated by ``;``::

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": ...}

Only an output that (after leading whitespace) starts with ``{`` or the tag is read as calls;
anything else is all content. An object needs ``name`` and ``parameters`` (or ``arguments``):
a model answering in plain JSON (``{"name": "Ada", "age": 36}``) is not calling a tool.
Text after the last call is content. The tag is a special token: the output must be
detokenized with it kept, or only the ``{`` form is recognized.
"""

from __future__ import annotations

from router.tools.call import call_from_object, decode_at
from router.tools.parser import MALFORMED, Block, BlockToolParser, skip_ws

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

    def decide(self, body: str, final: bool) -> Block | None:
        i = skip_ws(body, 0)
        if body.startswith(";", i):  # a call after the first one
            i = skip_ws(body, i + 1)
        if i == len(body):
            return MALFORMED if final else None
        if body[i] != "{":
            return MALFORMED
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
