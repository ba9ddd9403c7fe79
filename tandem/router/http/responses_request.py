"""OpenAI's Responses API request (``POST /v1/responses``) -> the chat request it amounts to.

The body is translated into a chat completions body and parsed by the chat path
(tandem/router/http/openai_request.py ``parse``): one parser, one set of checks, the same
admission, caps and limits.

    instructions                          -> a system message first
    input: "text"                         -> one user message
    input: [items]
      {"role", "content"} / type message  -> a message (content: text, or input_text /
                                             output_text / refusal parts)
      function_call {call_id, name, arguments}
                                          -> an assistant message's tool call (consecutive
                                             calls: one message)
      function_call_output {call_id, output}
                                          -> a tool message answering that call
      reasoning                           -> dropped (templates drop past thinking too)
    tools: [{"type": "function", name, description, parameters, strict}]
                                          -> chat's tools
    tool_choice: auto | none | required | {"type": "function", "name"}
    max_output_tokens                     -> max_tokens
    text.format: text | json_object | json_schema {name, schema, strict}
                                          -> response_format
    temperature, top_p, parallel_tool_calls, user, metadata (echoed), and vLLM's extras
    (top_k, min_p, seed, stop, chat_template_kwargs, structured_outputs, ...) as chat takes them

Stateless: nothing is kept after the answer, so ``store: true``, ``previous_response_id``,
``conversation``, ``background: true`` and ``item_reference`` items are refused (400) with
what to send instead. Tool types other than ``function`` (web search, file search, ...) and
input other than text (images, files) are refused by name. ``reasoning`` and ``include`` are
accepted and have no effect: whether a model thinks is its template's (``chat_template_kwargs``)
and reasoning items come back in clear text, never encrypted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tandem.router.errors import InvalidRequestError
from tandem.router.http.openai_request import ApiRequest, Endpoint, parse

# Chat body fields a Responses body may carry as they are (OpenAI's and vLLM's extras).
_PASSED = ("temperature", "top_p", "parallel_tool_calls", "user", "stream", "top_k", "min_p",
           "seed", "stop", "stop_token_ids", "repetition_penalty", "presence_penalty",
           "frequency_penalty", "min_tokens", "ignore_eos", "logit_bias", "skip_special_tokens",
           "speculative", "chat_template_kwargs", "structured_outputs", "guided_json",
           "guided_regex", "guided_choice", "guided_grammar", "include_reasoning")
_STATEFUL = {
    "previous_response_id": "this server keeps no responses: send the whole conversation in "
                            "input (earlier output items included)",
    "conversation": "this server keeps no conversations: send the whole conversation in input",
}
MAX_METADATA = 16  # OpenAI's bound: 16 pairs, keys <= 64 and values <= 512 characters


@dataclass(slots=True)
class ResponsesRequest:
    """A parsed Responses request: the chat request it runs as, and what its answer echoes."""

    api: ApiRequest
    instructions: str | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)  # as given
    tool_choice: Any = "auto"
    text_format: dict[str, Any] = field(default_factory=lambda: {"type": "text"})
    metadata: dict[str, str] = field(default_factory=dict)
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    parallel_tool_calls: bool = True
    user: str | None = None


def parse_responses(body: Any) -> ResponsesRequest:
    """Map a decoded Responses body; raises InvalidRequestError naming the field."""
    if not isinstance(body, dict):
        raise InvalidRequestError("body", "must be a JSON object")
    _refuse_state(body)
    chat: dict[str, Any] = {k: body[k] for k in ("model", *_PASSED) if k in body}
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequestError("instructions", "must be a string")
    messages = [{"role": "system", "content": instructions}] if instructions else []
    messages += input_messages(body.get("input"))
    chat["messages"] = messages
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise InvalidRequestError("tools", "must be a list")
    if tools:
        chat["tools"] = [_tool(t, i) for i, t in enumerate(tools)]
    tool_choice = body.get("tool_choice")
    if tool_choice is not None:
        chat["tool_choice"] = _tool_choice(tool_choice)
    max_output = body.get("max_output_tokens")
    if max_output is not None:
        if isinstance(max_output, bool) or not isinstance(max_output, int) or max_output < 1:
            raise InvalidRequestError("max_output_tokens", "must be a positive integer")
        chat["max_tokens"] = max_output
    text_format = _text_format(body.get("text"))
    if text_format["type"] != "text":
        chat["response_format"] = _response_format(text_format)
    api = parse(Endpoint.CHAT, chat)
    return ResponsesRequest(
        api=api, instructions=instructions, tools=tools,
        tool_choice="auto" if tool_choice is None else tool_choice, text_format=text_format,
        metadata=_metadata(body.get("metadata")), max_output_tokens=max_output,
        temperature=chat.get("temperature"), top_p=chat.get("top_p"),
        parallel_tool_calls=chat.get("parallel_tool_calls", True) is not False,
        user=chat.get("user"))


def input_messages(value: Any) -> list[dict[str, Any]]:
    """``input`` as chat messages (a text: one user message)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InvalidRequestError("input", "must be a string or a non-empty list of items")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequestError(where, "must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            out.append({"role": _role(item, where), "content": _text(item.get("content"), where)})
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", where), "type": "function",
                    "function": {"name": _string(item, "name", where),
                                 "arguments": _string(item, "arguments", where)}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else _text(output, f"{where}.output")
            out.append({"role": "tool", "tool_call_id": _string(item, "call_id", where),
                        "content": content})
        elif kind == "reasoning":
            continue
        elif kind == "item_reference":
            raise InvalidRequestError(where, "item_reference needs stored items; this server "
                                      "keeps none: send the item itself")
        else:
            raise InvalidRequestError(f"{where}.type", f"{kind!r} items are not supported "
                                      "(message, function_call, function_call_output, "
                                      "reasoning are)")
    return out


def _refuse_state(body: dict[str, Any]) -> None:
    if body.get("store") is True:
        raise InvalidRequestError("store", "this server keeps no responses (stateless): send "
                                  "store: false or leave it out, and the whole conversation "
                                  "in input")
    if body.get("background") is True:
        raise InvalidRequestError("background", "background responses need a stored response "
                                  "to poll; this server keeps none: stream instead")
    for key, why in _STATEFUL.items():
        if body.get(key) is not None:
            raise InvalidRequestError(key, why)


def _role(item: dict[str, Any], where: str) -> str:
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise InvalidRequestError(f"{where}.role", "one of user, system, developer, assistant")
    return str(role)


def _text(content: Any, where: str) -> str:
    """A message's text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError(f"{where}.content", "must be a string or a list of parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text", "refusal"):
            raise InvalidRequestError(f"{where}.content[{j}]",
                                      f"{kind!r} parts are not supported (text only)")
        text = part.get("refusal" if kind == "refusal" else "text")
        if not isinstance(text, str):
            raise InvalidRequestError(f"{where}.content[{j}]", "needs its text as a string")
        texts.append(text)
    return "".join(texts)


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise InvalidRequestError(f"{where}.{key}", "must be a string")
    return value


def _tool(tool: Any, i: int) -> dict[str, Any]:
    """A Responses function tool as chat's ``tools`` item."""
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise InvalidRequestError(where, "must be an object")
    if tool.get("type") != "function":
        raise InvalidRequestError(f"{where}.type", f"{tool.get('type')!r} tools are not "
                                  "supported (function tools are)")
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict")
                if tool.get(k) is not None}
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise InvalidRequestError("tool_choice", "auto, none, required or "
                              '{"type": "function", "name": ...}')


def _text_format(text: Any) -> dict[str, Any]:
    if text is None:
        return {"type": "text"}
    if not isinstance(text, dict):
        raise InvalidRequestError("text", "must be an object")
    fmt = text.get("format") or {"type": "text"}
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object",
                                                             "json_schema"):
        raise InvalidRequestError("text.format.type", "one of text, json_object, json_schema")
    return fmt


def _response_format(fmt: dict[str, Any]) -> dict[str, Any]:
    """``text.format`` as chat's ``response_format``."""
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"type": "json_schema", "json_schema": spec}


def _metadata(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    ok = isinstance(value, dict) and len(value) <= MAX_METADATA and all(
        isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
        for k, v in value.items())
    if not ok:
        raise InvalidRequestError("metadata", f"at most {MAX_METADATA} string pairs (keys <= "
                                  "64, values <= 512 characters)")
    return dict(value)
