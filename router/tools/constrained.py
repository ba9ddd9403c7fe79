"""Forced tool calls (``tool_choice`` "required" or named): the JSON Schema the grammar engine
must hold the output to, and the calls read back from that output.

The forced output is plain JSON, no model-specific markup, so one schema and one reader serve
every model::

    named "f":  {"city": "Paris"}                                   (f's arguments)
    required:   [{"name": "f", "parameters": {"city": "Paris"}}]    (one item unless parallel)

A parameters schema without a ``type`` gets ``"type": "object"`` (arguments are an object),
and ``$defs`` / ``definitions`` are hoisted to the root of the "required" schema, where their
``#/$defs/...`` references resolve once the schema is nested.
"""

from __future__ import annotations

from typing import Any

from router.errors import InvalidRequestError
from router.tools.call import JSON_DECODER, ToolCall, dump_arguments, new_call_id
from router.tools.spec import ToolChoice, ToolSpec

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
    """The calls in an output forced by ``choice_schema``; raises ToolParseError."""
    value = _decode(text)
    if choice.mode == "named":
        if not isinstance(value, dict):
            raise ToolParseError("the arguments are not a JSON object")
        return [ToolCall(new_call_id(), _tool(tools, choice).name, dump_arguments(value))]
    if choice.mode != "required":
        raise ValueError(f"tool_choice {choice.mode!r} forces no output")
    if not isinstance(value, list) or not value:
        raise ToolParseError("the output is not a non-empty JSON array")
    names = {tool.name for tool in tools}
    calls = []
    for item in value:
        if not isinstance(item, dict) or item.get("name") not in names:
            raise ToolParseError("an item does not name a declared tool")
        if not isinstance(item.get("parameters"), dict):
            raise ToolParseError("an item's parameters are not a JSON object")
        calls.append(ToolCall(new_call_id(), item["name"], dump_arguments(item["parameters"])))
    return calls


def _decode(text: str) -> Any:
    try:
        return JSON_DECODER.decode(text)
    except ValueError as e:  # JSONDecodeError, or a NaN/Infinity constant
        raise ToolParseError(f"the output is not valid JSON: {e}") from None


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
