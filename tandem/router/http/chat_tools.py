"""The tool-calling parts of an OpenAI chat body -> ``ChatMessages``.

    tools / functions, tool_choice / function_call, parallel_tool_calls
        -> chat.tools_json (the checked tools, as templates take them), chat.tool_choice
    messages[i].tool_calls (assistant), tool_call_id and name (tool)  -> ChatMessage fields
    legacy history: an assistant's function_call -> one tool call; a "function" message (its
        name, its content) -> a tool message answering the latest such call

The checks are tandem/router/tools/spec.py's (errors name the HTTP field).
"""

from __future__ import annotations

import json
from typing import Any

from tandem.protos.v1 import tandem_pb2
from tandem.router.errors import InvalidRequestError
from tandem.router.tools import parse_request_tools, to_template_tools


def parse_chat_tools(body: dict[str, Any], chat: tandem_pb2.ChatMessages) -> bool:
    """Set the chat's tools and tool choice from the body (unchanged when it has none);
    whether they came as the legacy ``functions`` (then the answer takes the legacy shape)."""
    request = parse_request_tools(body)
    if not request.tools:
        return request.legacy
    chat.tools_json = json.dumps(to_template_tools(request.tools), separators=(",", ":"))
    choice = request.choice
    chat.tool_choice = choice.name if choice.mode == "named" and choice.name else choice.mode
    chat.parallel_tool_calls = request.parallel_tool_calls
    return request.legacy


class MessageTools:
    """The tool parts of a history's messages, read in order (a legacy ``function`` message
    answers the latest legacy ``function_call`` before it)."""

    def __init__(self) -> None:
        self._legacy_id = ""

    def add(self, message: dict[str, Any], i: int, out: tandem_pb2.ChatMessage) -> None:
        """Message ``i``'s tool parts into ``out``; the legacy ones as tool calls and tool
        messages, which every chat template renders."""
        if out.role == "function":
            name = message.get("name")
            if not isinstance(name, str) or not name:
                raise InvalidRequestError(f"messages[{i}].name",
                                          "a function message needs the function's name")
            out.role = "tool"
            if self._legacy_id and message.get("tool_call_id") is None:
                out.tool_call_id = self._legacy_id
        parse_message_tools(message, i, out)
        call = message.get("function_call")
        if call is None:
            return
        where = f"messages[{i}].function_call"
        if message.get("tool_calls"):
            raise InvalidRequestError(where, "send tool_calls or function_call, not both")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise InvalidRequestError(where, "needs a name")
        # Legacy calls have no id: one minted from the position (9 letters and digits, the
        # shape Mistral's templates insist on) pairs the call with its answer.
        self._legacy_id = f"call{i:05d}"
        out.tool_calls.add(id=self._legacy_id, name=call["name"],
                           arguments=_arguments(call.get("arguments", "{}")))


def parse_message_tools(message: dict[str, Any], i: int, out: tandem_pb2.ChatMessage) -> None:
    """An assistant message's ``tool_calls``, a tool message's ``tool_call_id`` and ``name``."""
    for key in ("tool_call_id", "name"):
        value = message.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or len(value) > 256:
            raise InvalidRequestError(f"messages[{i}].{key}", "must be a string (<= 256 chars)")
        setattr(out, key, value)
    calls = message.get("tool_calls")
    if calls is None:
        return
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
        out.tool_calls.add(id=call_id, name=function["name"],
                           arguments=_arguments(function.get("arguments", "{}")))


def _arguments(arguments: Any) -> str:
    """A call's arguments as text (some clients send the object itself)."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments)
