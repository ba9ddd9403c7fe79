"""OpenAI ``tools`` / ``tool_choice`` (and the legacy ``functions`` / ``function_call``) from a
decoded request body, checked; a bad field raises InvalidRequestError naming it
(``tools[0].function.name``).

Normalization: an empty tool list is no tools, and with no tools ``tool_choice: "auto"`` means
``"none"``, so a caller only needs ``ToolChoice.mode``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from tandem.router.errors import InvalidRequestError

MAX_TOOLS = 128  # OpenAI's limit
_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def _empty_object_schema() -> dict[str, Any]:
    return {"type": "object", "properties": {}}


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One function the model may call; ``parameters`` is its arguments' JSON Schema."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] = field(default_factory=_empty_object_schema)
    strict: bool = False


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """Whether the model may (auto), must (required), must not (none) call a tool, or must call
    the one named (named)."""

    mode: Literal["none", "auto", "required", "named"]
    name: str | None = None

    @property
    def constrained(self) -> bool:
        """Whether the output must be forced by a grammar (see tandem/router/tools/constrained.py)."""
        return self.mode in ("required", "named")


@dataclass(frozen=True, slots=True)
class ToolRequest:
    """The tool-calling part of a chat request. ``legacy``: it came as ``functions``, so the
    answer goes in ``message.function_call`` (one call at most)."""

    tools: list[ToolSpec]
    choice: ToolChoice
    parallel_tool_calls: bool = True
    legacy: bool = False


def parse_request_tools(body: dict[str, Any]) -> ToolRequest:
    """``tools``, ``functions``, ``tool_choice``, ``function_call`` and ``parallel_tool_calls``."""
    if body.get("tools") is not None and body.get("functions") is not None:
        raise InvalidRequestError("functions", "send tools or functions, not both")
    if body.get("tool_choice") is not None and body.get("function_call") is not None:
        raise InvalidRequestError("function_call", "send tool_choice or function_call, not both")
    legacy = body.get("functions") is not None
    tools = parse_functions(body["functions"]) if legacy else parse_tools(body.get("tools"))
    if body.get("function_call") is not None:
        choice = parse_function_call(body["function_call"], tools)
    else:
        choice = parse_tool_choice(body.get("tool_choice"), tools)
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise InvalidRequestError("parallel_tool_calls", "must be a boolean")
    return ToolRequest(tools, choice, parallel and not legacy, legacy)


def parse_tools(raw: Any) -> list[ToolSpec]:
    """``tools``: ``[{"type": "function", "function": {"name": ..., ...}}, ...]``."""
    specs: list[ToolSpec] = []
    for i, item in enumerate(_list(raw, "tools")):
        where = f"tools[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequestError(where, "must be an object")
        if item.get("type") != "function":
            raise InvalidRequestError(f"{where}.type", "must be 'function'")
        specs.append(_function(item.get("function"), f"{where}.function", specs))
    return specs


def parse_functions(raw: Any) -> list[ToolSpec]:
    """The legacy ``functions``: ``[{"name": ..., ...}, ...]``."""
    specs: list[ToolSpec] = []
    for i, item in enumerate(_list(raw, "functions")):
        specs.append(_function(item, f"functions[{i}]", specs))
    return specs


def parse_tool_choice(raw: Any, tools: list[ToolSpec]) -> ToolChoice:
    """``tool_choice``: ``"none"``, ``"auto"``, ``"required"`` or
    ``{"type": "function", "function": {"name": ...}}``; absent means auto with tools."""
    if isinstance(raw, dict):
        if raw.get("type") != "function":
            raise InvalidRequestError("tool_choice.type", "must be 'function'")
        function = raw.get("function")
        if not isinstance(function, dict):
            raise InvalidRequestError("tool_choice.function", "must be an object")
        return _named(function.get("name"), tools, "tool_choice.function.name")
    return _mode(raw, tools, "tool_choice", ("none", "auto", "required"))


def parse_function_call(raw: Any, tools: list[ToolSpec]) -> ToolChoice:
    """The legacy ``function_call``: ``"none"``, ``"auto"`` or ``{"name": ...}``."""
    if isinstance(raw, dict):
        return _named(raw.get("name"), tools, "function_call.name")
    return _mode(raw, tools, "function_call", ("none", "auto"))


def to_template_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    """The list a Hugging Face chat template's ``tools=`` argument expects (OpenAI's shape;
    ``description`` only where one was given)."""
    out: list[dict[str, Any]] = []
    for tool in tools:
        function: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            function["description"] = tool.description
        function["parameters"] = tool.parameters
        out.append({"type": "function", "function": function})
    return out


def _list(raw: Any, where: str) -> list[Any]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise InvalidRequestError(where, "must be an array")
    if len(raw) > MAX_TOOLS:
        raise InvalidRequestError(where, f"at most {MAX_TOOLS} tools, got {len(raw)}")
    return raw


def _function(raw: Any, where: str, before: list[ToolSpec]) -> ToolSpec:
    """One function object at ``where``; its name must differ from those ``before`` it."""
    if not isinstance(raw, dict):
        raise InvalidRequestError(where, "must be an object")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidRequestError(f"{where}.name", "must be 1-64 of a-z, A-Z, 0-9, _ and -")
    if any(tool.name == name for tool in before):
        raise InvalidRequestError(f"{where}.name", f"another tool is already named {name!r}")
    description = raw.get("description")
    if description is not None and not isinstance(description, str):
        raise InvalidRequestError(f"{where}.description", "must be a string")
    parameters = raw.get("parameters")
    if parameters is None:
        parameters = _empty_object_schema()
    elif not isinstance(parameters, dict):
        raise InvalidRequestError(f"{where}.parameters", "must be a JSON Schema object")
    strict = raw.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequestError(f"{where}.strict", "must be a boolean")
    return ToolSpec(name, description, parameters, bool(strict))


def _named(name: Any, tools: list[ToolSpec], where: str) -> ToolChoice:
    if not isinstance(name, str):
        raise InvalidRequestError(where, "must be a string")
    if all(tool.name != name for tool in tools):
        raise InvalidRequestError(where, f"no tool named {name!r} was given")
    return ToolChoice("named", name)


def _mode(raw: Any, tools: list[ToolSpec], where: str, modes: tuple[str, ...]) -> ToolChoice:
    if raw is None:
        raw = "auto"
    if raw not in modes:
        raise InvalidRequestError(where, f"must be one of {', '.join(modes)} or a function")
    if not tools:
        if raw == "required":
            raise InvalidRequestError(where, "'required' needs tools")
        return ToolChoice("none")
    return ToolChoice(raw)
