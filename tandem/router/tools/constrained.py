"""Forced tool calls (``tool_choice`` "required" or named): the JSON Schema the grammar engine
must hold the output to, and the calls read back from that output.

The forced output is plain JSON, no model-specific markup, so one schema and one reader serve
every model::

    named "f":  {"city": "Paris"}                                   (f's arguments)
    required:   [{"name": "f", "parameters": {"city": "Paris"}}]    (one item unless parallel)

A parameters schema without a ``type`` gets ``"type": "object"`` (arguments are an object),
and ``$defs`` / ``definitions`` are hoisted to the root of the "required" schema, where their
``#/$defs/...`` references resolve once the schema is nested.

The calls are read as they are written (``ConstrainedStream``, tandem/router/tools/json_stream.py):
a named call goes out as soon as its ``{`` does, a required one once its name is read, then
the arguments piece by piece. An output cut off (max_tokens) keeps the calls opened so far,
the last one's arguments as far as they were written; one that opened no call is content.
"""

from __future__ import annotations

from typing import Any

from tandem.router.errors import InvalidRequestError
from tandem.router.tools.call import (
    CallDelta,
    ContentDelta,
    ToolCall,
    ToolDelta,
    collect,
    new_call_id,
)
from tandem.router.tools.json_stream import DONE, OPEN, CallHead, Head, JsonScanner, read_call_head
from tandem.router.tools.parser import StreamingToolParser
from tandem.router.tools.spec import ToolChoice, ToolSpec

_DEFS_KEYS = ("$defs", "definitions")


class ToolParseError(ValueError):
    """The forced output is not the JSON its schema asks for (e.g. cut short by max_tokens);
    callers answer with the text as content and no calls."""


def choice_schema(
    tools: list[ToolSpec], choice: ToolChoice, parallel_tool_calls: bool = True
) -> dict[str, Any] | None:
    """The schema the whole output must match under ``choice``; None when nothing is forced."""
    if choice.mode == "named":
        return _arguments_schema(_tool(tools, choice).parameters)
    if choice.mode != "required":
        return None
    defs: dict[str, dict[str, Any]] = {}
    variants = []
    for i, tool in enumerate(tools):
        parameters = _hoist_defs(tool.parameters, defs, f"tools[{i}].function.parameters")
        variants.append(
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [tool.name]},
                    "parameters": _arguments_schema(parameters),
                },
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
        )
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": variants}}
    if not parallel_tool_calls:
        schema["maxItems"] = 1
    schema.update({key: value for key, value in defs.items() if value})
    return schema


def parse_constrained(text: str, tools: list[ToolSpec], choice: ToolChoice) -> list[ToolCall]:
    """The calls in an output forced by ``choice_schema``; raises ToolParseError when it
    opened none."""
    stream = ConstrainedStream(tools, choice)
    parsed = collect(stream.feed(text) + stream.finish())
    if not parsed.calls:
        raise ToolParseError("the output is not the forced JSON")
    return parsed.calls


class ConstrainedStream(StreamingToolParser):
    """The calls of an output forced by ``choice_schema``, as they are written::

        named:     {"city": "Paris"}                         the arguments themselves
        required:  [{"name": "f", "parameters": {...}}, ...]  one call per item

    Nothing but calls: an output that opened no call is all content, at ``finish``; what
    follows a break in the forced shape (which the grammar rules out) is dropped.
    """

    def __init__(self, tools: list[ToolSpec], choice: ToolChoice) -> None:
        if choice.mode == "named":
            self._name: str | None = _tool(tools, choice).name
        elif choice.mode == "required":
            self._name = None
        else:
            raise ValueError(f"tool_choice {choice.mode!r} forces no output")
        self._names = {tool.name for tool in tools}
        self._text: list[str] = []  # the whole output, for when it opens no call
        self._buf = ""  # not read yet
        self._step = _START
        self._index = 0  # calls opened
        self._scanner: JsonScanner | None = None

    def feed(self, delta: str) -> list[ToolDelta]:
        self._text.append(delta)
        self._buf += delta
        return self._run(final=False)

    def finish(self) -> list[ToolDelta]:
        out = self._run(final=True)
        if not self._index:
            text = "".join(self._text)
            return [ContentDelta(text)] if text else []
        return out

    def _run(self, final: bool) -> list[ToolDelta]:
        out: list[ToolDelta] = []
        while self._step != _END:
            if self._step in (_ARGUMENTS, _REST):
                if not self._scan(final, out):
                    break
                continue
            buf = self._buf
            i = _skip_ws(buf)
            if i == len(buf):
                if final:
                    self._step = _END
                break
            if self._step == _START and self._name is not None:  # named: the arguments
                if buf[i] != "{":
                    self._step = _END
                    continue
                self._open(self._name, i, out)
            elif self._step == _START:  # required: the list
                self._step, self._buf = (_HEAD, buf[i + 1 :]) if buf[i] == "[" else (_END, "")
            elif self._step == _HEAD:
                head = read_call_head(buf, i, ('"parameters"',))
                if head is Head.MORE and not final:
                    break
                if isinstance(head, CallHead) and head.name in self._names:
                    self._open(head.name, head.start, out)
                else:
                    self._step = _END
            else:  # _NEXT: after an item
                self._step, self._buf = (_HEAD, buf[i + 1 :]) if buf[i] == "," else (_END, "")
        return out

    def _open(self, name: str, start: int, out: list[ToolDelta]) -> None:
        out.append(CallDelta(self._index, new_call_id(), name, ""))
        self._index += 1
        self._buf = self._buf[start:]
        self._scanner = JsonScanner()
        self._step = _ARGUMENTS

    def _scan(self, final: bool, out: list[ToolDelta]) -> bool:
        """Read on in the arguments (sent) or the rest of the item (not); False: needs more."""
        scanner = self._scanner
        assert scanner is not None
        self._buf = self._buf[scanner.feed(self._buf) :]
        piece = scanner.take()
        if piece and self._step == _ARGUMENTS:
            out.append(CallDelta(self._index - 1, None, None, piece))
        if scanner.state == OPEN:
            if final:
                self._step = _END
            return final
        if scanner.state != DONE or self._name is not None:
            self._step = _END  # broken, or the one named call is complete
        elif self._step == _ARGUMENTS:
            self._step, self._scanner = _REST, JsonScanner(in_object=True)
        else:
            self._step = _NEXT
        return True


_START, _HEAD, _ARGUMENTS, _REST, _NEXT, _END = range(6)


def _skip_ws(text: str) -> int:
    return len(text) - len(text.lstrip(" \t\n\r"))


def _tool(tools: list[ToolSpec], choice: ToolChoice) -> ToolSpec:
    for tool in tools:
        if tool.name == choice.name:
            return tool
    raise ValueError(f"tool_choice names {choice.name!r}, which is not among the tools")


def _arguments_schema(parameters: dict[str, Any]) -> dict[str, Any]:
    if "type" in parameters:
        return parameters
    return {"type": "object", **parameters}


def _hoist_defs(
    parameters: dict[str, Any], defs: dict[str, dict[str, Any]], where: str
) -> dict[str, Any]:
    """``parameters`` without its definitions, which move into ``defs`` (by keyword)."""
    if not any(key in parameters for key in _DEFS_KEYS):
        return parameters
    rest = {key: value for key, value in parameters.items() if key not in _DEFS_KEYS}
    for key in _DEFS_KEYS:
        table = parameters.get(key)
        if table is None:
            continue
        if not isinstance(table, dict):
            raise InvalidRequestError(f"{where}.{key}", "must be an object")
        merged = defs.setdefault(key, {})
        for name, definition in table.items():
            if name in merged and merged[name] != definition:
                raise InvalidRequestError(
                    f"{where}.{key}.{name}", "differs from another tool's definition of that name"
                )
            merged[name] = definition
    return rest
