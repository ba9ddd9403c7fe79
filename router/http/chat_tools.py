"""The tool-calling parts of an OpenAI chat body -> ``ChatMessages``.

    tools / functions, tool_choice / function_call, parallel_tool_calls
        -> chat.tools_json (the checked tools, as templates take them), chat.tool_choice
    messages[i].tool_calls (assistant), tool_call_id and name (tool)  -> ChatMessage fields

The checks are router/tools/spec.py's (errors name the HTTP field).
"""

from __future__ import annotations

import json
from typing import Any

from protos.tandem.v1 import tandem_pb2
from router.errors import InvalidRequestError
from router.tools import parse_request_tools, to_template_tools


def parse_chat_tools(body: dict[str, Any], chat: tandem_pb2.ChatMessages) -> None:
    """Set the chat's tools and tool choice from the body (unchanged when it has none)."""
    request = parse_request_tools(body)
    if not request.tools:
        return
    chat.tools_json = json.dumps(to_template_tools(request.tools), separators=(",", ":"))
    choice = request.choice
    chat.tool_choice = choice.name if choice.mode == "named" and choice.name else choice.mode
    chat.parallel_tool_calls = request.parallel_tool_calls


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
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):  # some clients send the object itself
            arguments = json.dumps(arguments)
        call_id = call.get("id", "")
        if not isinstance(call_id, str):
            raise InvalidRequestError(f"{where}.id", "must be a string")
        out.tool_calls.add(id=call_id, name=function["name"], arguments=arguments)
