"""The tool-calling parts of an OpenAI chat body -> the plain ``Chat`` (tandem/router/api/chat.py).

    tools / functions, tool_choice / function_call, parallel_tool_calls
        -> chat.tools_json (the checked tools, as templates take them), chat.tool_choice
    messages[i].tool_calls (assistant), tool_call_id and name (tool)  -> ChatMessage fields
    legacy history: an assistant's function_call -> one tool call; a "function" message (its
        name, its content) -> a tool message answering the latest such call

The checks are tandem/router/tools/spec.py's (errors name the HTTP field).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tandem.router.api.chat import ChatMessage
from tandem.router.errors import InvalidRequestError
from tandem.router.tools import parse_request_tools, to_template_tools
from tandem.router.tools.call import ToolCall


@dataclass(frozen=True, slots=True)
class ChatTools:
    """A chat body's tools as ``Chat`` takes them ("" and true: none given), and whether they
    came as the legacy ``functions`` (then the answer takes the legacy shape)."""

    tools_json: str = ""
    tool_choice: str = ""
    parallel_tool_calls: bool = True
    legacy: bool = False


def parse_chat_tools(body: dict[str, Any]) -> ChatTools:
    """The chat's tools and tool choice from the body."""
    request = parse_request_tools(body)
    if not request.tools:
        return ChatTools(legacy=request.legacy)
    choice = request.choice
    return ChatTools(
        tools_json=json.dumps(to_template_tools(request.tools), separators=(",", ":")),
        tool_choice=choice.name if choice.mode == "named" and choice.name else choice.mode,
        parallel_tool_calls=request.parallel_tool_calls,
        legacy=request.legacy,
    )


class MessageTools:
    """The tool parts of a history's messages, read in order (a legacy ``function`` message
    answers the latest legacy ``function_call`` before it)."""

    def __init__(self) -> None:
        self._legacy_id = ""

    def add(self, message: dict[str, Any], i: int, role: str, content: str) -> ChatMessage:
        """Message ``i`` (its ``role`` and ``content`` read) with its tool parts; the legacy
        ones as tool calls and tool messages, which every chat template renders."""
        tool_call_id = ""
        if role == "function":
            name = message.get("name")
            if not isinstance(name, str) or not name:
                raise InvalidRequestError(f"messages[{i}].name",
                                          "a function message needs the function's name")
            role = "tool"
            if self._legacy_id and message.get("tool_call_id") is None:
                tool_call_id = self._legacy_id
        fields, calls = parse_message_tools(message, i)
        fields.setdefault("tool_call_id", tool_call_id)
        call = message.get("function_call")
        if call is not None:
            calls.append(self._legacy_call(message, i, call))
        return ChatMessage(role=role, content=content, tool_calls=tuple(calls), **fields)

    def _legacy_call(self, message: dict[str, Any], i: int, call: Any) -> ToolCall:
        """An assistant's legacy ``function_call`` as a tool call."""
        where = f"messages[{i}].function_call"
        if message.get("tool_calls"):
            raise InvalidRequestError(where, "send tool_calls or function_call, not both")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise InvalidRequestError(where, "needs a name")
        # Legacy calls have no id: one minted from the position (9 letters and digits, the
        # shape Mistral's templates insist on) pairs the call with its answer.
        self._legacy_id = f"call{i:05d}"
        return ToolCall(self._legacy_id, call["name"], _arguments(call.get("arguments", "{}")))


def parse_message_tools(message: dict[str, Any], i: int
                        ) -> tuple[dict[str, str], list[ToolCall]]:
    """A tool message's ``tool_call_id`` and ``name`` (those present) and an assistant
    message's ``tool_calls``."""
    fields: dict[str, str] = {}
    out: list[ToolCall] = []
    for key in ("tool_call_id", "name"):
        value = message.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or len(value) > 256:
            raise InvalidRequestError(f"messages[{i}].{key}", "must be a string (<= 256 chars)")
        fields[key] = value
    calls = message.get("tool_calls")
    if calls is None:
        return fields, out
    if not isinstance(calls, list):
        raise InvalidRequestError(f"messages[{i}].tool_calls", "must be a list")
    for j, call in enumerate(calls):
        where = f"messages[{i}].tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidRequestError(where, "needs a function with a name")
        call_id = call.get("id", "")
        if not isinstance(call_id, str):
            raise InvalidRequestError(f"{where}.id", "must be a string")
        out.append(ToolCall(call_id, function["name"],
                            _arguments(function.get("arguments", "{}"))))
    return fields, out


def _arguments(arguments: Any) -> str:
    """A call's arguments as text (some clients send the object itself)."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments)
