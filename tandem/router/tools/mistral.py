"""Mistral tool calls: ``[TOOL_CALLS]`` then the calls, in either of two shapes::

    Some content.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]
    Some content.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]other[ARGS]{}

The first is the older tokenizers' (v3 and before; a lone object is accepted too), the second
the newer ones' (v11+; its ``[CALL_ID]`` variant is not read). Text after the calls is content.
``[TOOL_CALLS]`` and ``[ARGS]`` are special tokens: the output must be detokenized with them
kept. The second shape streams each call's arguments as they are written
(tandem/router/tools/parser.py); the first is read whole.
"""

from __future__ import annotations

import re

from tandem.router.tools.call import call_from_object, decode_at
from tandem.router.tools.parser import (
    MALFORMED,
    Block,
    BlockToolParser,
    Opened,
    find_tag,
    skip_ws,
)

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
_NAME = re.compile(r"[A-Za-z0-9_.-]+")


class MistralToolParser(BlockToolParser):
    """``[TOOL_CALLS]`` followed by a JSON array of calls, or by ``name[ARGS]{...}``."""

    name = "mistral"

    def find_open(self, text: str, at_start: bool, final: bool) -> tuple[int, int | None]:
        return find_tag(text, TOOL_CALLS, final)

    def decide(self, body: str, final: bool) -> Block | Opened | None:
        i = skip_ws(body, 0)
        if i == len(body):
            return MALFORMED if final else None
        if body[i] in "[{":
            return _json_calls(body, i, final)
        name = _NAME.match(body, i)
        if name is None:
            return MALFORMED
        j = name.end()
        if not body.startswith(ARGS, j):
            still_open = not final and ARGS.startswith(body[j:])  # includes j == len(body)
            return None if still_open else MALFORMED
        k = skip_ws(body, j + len(ARGS))
        if k == len(body):
            return MALFORMED if final else None
        if body[k] != "{":
            return MALFORMED
        return Opened(name.group(), k, wrapped=False)


def _json_calls(body: str, i: int, final: bool) -> Block | None:
    """The ``[{...}, ...]`` (or lone ``{...}``) shape starting at ``body[i]``."""
    decoded = decode_at(body, i)
    if decoded is None:
        return MALFORMED if final else None
    value, end = decoded
    items = value if isinstance(value, list) else [value]
    calls = [call_from_object(item) for item in items]
    if not calls or any(call is None for call in calls):
        return MALFORMED
    return Block([call for call in calls if call is not None], end)
