"""Tool calls from the parsed output to the OpenAI shapes: ``ToolOutput`` (content and call
pieces per text delta), the messages the Frontend builds from them, and what the HTTP shaper
makes of those, streamed and whole, in today's ``tool_calls`` shape and the legacy
``function_call`` one."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from tandem.router.api.chat import Chat
from tandem.router.api.response import ResponseChunk
from tandem.router.http.openai_request import Endpoint, parse
from tandem.router.http.openai_response import ResponseShaper
from tandem.router.sequence_shape import with_calls
from tandem.router.tool_use import ToolOutput, ToolUse
from tandem.router.tools import PARSERS, ToolChoice, ToolRequest, ToolSpec

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}
USER = [{"role": "user", "content": "Weather in Paris?"}]
TOOLS = [ToolSpec("get_weather"), ToolSpec("get_time")]
LONG = {"city": "Paris " * 30, "days": list(range(40))}


def hermes(name: str, arguments: object) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def auto_output(parallel: bool = True) -> ToolOutput:
    return ToolUse(ToolRequest(TOOLS, ToolChoice("auto"), parallel), PARSERS["hermes"]).output()


def pieces(text: str, size: int = 5) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def messages(output: ToolOutput, text: str, finish_reason: str = "stop"
             ) -> list[ResponseChunk]:
    """The messages the Frontend sends for ``text`` arriving in pieces (the last one, empty,
    carries the finish)."""
    out = []
    for piece in [*pieces(text), ""]:
        content, deltas = output.feed(piece)
        out.append(ResponseChunk("rid", text=content, tool_call_deltas=tuple(deltas)))
    last = replace(out[-1], finished=True, finish_reason=finish_reason)
    out[-1] = with_calls(last, output)
    return out


def shaper(body: dict[str, Any]) -> ResponseShaper:
    return ResponseShaper(parse(Endpoint.CHAT, body), "m", "rid", str)


def reassemble(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """What an OpenAI client builds from chat chunks: content, calls by index, the legacy
    function_call, the finish reason; and how many chunks carried argument text."""
    content, calls, function, finish, argument_chunks = "", {}, {}, None, 0
    for chunk in chunks:
        (choice,) = chunk["choices"]
        delta = choice["delta"]
        content += delta.get("content") or ""
        for item in delta.get("tool_calls") or []:
            call = calls.setdefault(item["index"], {"id": None, "name": None, "arguments": ""})
            call["id"] = item.get("id") or call["id"]
            call["name"] = item["function"].get("name") or call["name"]
            call["arguments"] += item["function"].get("arguments", "")
            argument_chunks += bool(item["function"].get("arguments"))
        if "function_call" in delta:
            function.setdefault("arguments", "")
            function["name"] = delta["function_call"].get("name") or function.get("name")
            function["arguments"] += delta["function_call"].get("arguments", "")
            argument_chunks += bool(delta["function_call"].get("arguments"))
        finish = choice["finish_reason"] or finish
    return {"content": content or None, "calls": [calls[i] for i in sorted(calls)],
            "function_call": function or None, "finish": finish,
            "argument_chunks": argument_chunks}


def test_tool_output_streams_call_pieces_and_ends_with_the_whole_calls() -> None:
    output = auto_output()
    text = "Let me check.\n" + hermes("get_weather", {"city": "Paris"}) + hermes("get_time", {})
    sent = messages(output, text)
    assert "".join(m.text for m in sent) == "Let me check."
    last = sent[-1]
    assert last.finish_reason == "tool_calls"
    assert [(c.name, c.arguments) for c in last.tool_calls] == [
        ("get_weather", '{"city":"Paris"}'), ("get_time", "{}")]
    heads = [d for m in sent for d in m.tool_call_deltas if d.id]
    assert [(d.index, d.id, d.name) for d in heads] == [
        (c_index, c.id, c.name) for c_index, c in enumerate(last.tool_calls)]
    # the head went out before the call's block was complete
    first_head = next(i for i, m in enumerate(sent) if m.tool_call_deltas)
    assert first_head < len(sent) - 3


def test_without_parallel_calls_only_the_first_call_is_kept() -> None:
    output = auto_output(parallel=False)
    sent = messages(output, hermes("get_weather", {"city": "x"}) + hermes("get_time", {}))
    assert {d.index for m in sent for d in m.tool_call_deltas} == {0}
    assert [c.name for c in sent[-1].tool_calls] == ["get_weather"]


def test_tool_choice_none_and_unknown_markup_pass_the_text_through() -> None:
    none = ToolUse(ToolRequest(TOOLS, ToolChoice("none")), PARSERS["hermes"]).output()
    unknown = ToolUse(ToolRequest(TOOLS, ToolChoice("auto")), None).output()
    text = hermes("get_weather", {})
    for output in (none, unknown):
        assert output.feed(text) == (text, [])
        assert output.finish() == ("", [], [])


def test_a_forced_call_streams_too_and_a_cut_one_keeps_its_text_as_is() -> None:
    named = ToolUse(ToolRequest(TOOLS, ToolChoice("named", "get_weather")), None).output()
    sent = messages(named, json.dumps(LONG), finish_reason="length")
    assert sum(1 for m in sent if m.tool_call_deltas) > 10
    assert sent[-1].finish_reason == "length"  # only a stop becomes tool_calls
    (call,) = sent[-1].tool_calls
    assert json.loads(call.arguments) == LONG
    required = ToolUse(ToolRequest(TOOLS, ToolChoice("required")), None).output()
    sent = messages(required, '[{"name": "nope"')  # no call opened: the text is content
    assert "".join(m.text for m in sent) == '[{"name": "nope"' and not sent[-1].tool_calls


@pytest.mark.parametrize("legacy", [False, True])
def test_streamed_calls_reassemble_to_the_whole_response(legacy: bool) -> None:
    body: dict[str, Any] = {"messages": USER}
    if legacy:
        body["functions"] = [WEATHER["function"]]
    else:
        body["tools"] = [WEATHER]
    text = "Sure.\n" + hermes("get_weather", LONG) + hermes("get_time", {})
    sent = messages(auto_output(parallel=not legacy), text)
    whole = shaper(body).whole(sent)["choices"][0]
    stream = shaper({**body, "stream": True})
    got = reassemble([stream.chunk(m, with_usage=False) for m in sent])
    message = whole["message"]
    assert got["content"] == message["content"] == "Sure."
    assert got["argument_chunks"] > 5  # a long call's arguments come in many chunks
    if legacy:
        assert whole["finish_reason"] == got["finish"] == "function_call"
        assert "tool_calls" not in message
        assert got["function_call"] == message["function_call"]
        assert message["function_call"]["name"] == "get_weather"
        assert json.loads(message["function_call"]["arguments"]) == LONG
        assert got["calls"] == []
    else:
        assert whole["finish_reason"] == got["finish"] == "tool_calls"
        assert "function_call" not in message
        assert got["calls"] == [{"id": c["id"], "name": c["function"]["name"],
                                 "arguments": c["function"]["arguments"]}
                                for c in message["tool_calls"]]
        assert [c["function"]["name"] for c in message["tool_calls"]] == [
            "get_weather", "get_time"]


def test_a_streamed_call_opens_with_id_type_and_name_then_arguments_only() -> None:
    sent = messages(auto_output(), hermes("get_weather", LONG))
    stream = shaper({"messages": USER, "tools": [WEATHER], "stream": True})
    items = [item for m in sent for item in
             stream.chunk(m, with_usage=False)["choices"][0]["delta"].get("tool_calls") or []]
    head, rest = items[0], items[1:]
    assert head["index"] == 0 and head["type"] == "function" and head["id"].startswith("call_")
    assert head["function"]["name"] == "get_weather"
    assert rest and all(set(i) == {"index", "function"} and set(i["function"]) == {"arguments"}
                        for i in rest)


def test_the_legacy_history_renders_as_tool_calls_and_tool_messages() -> None:
    history = [*USER,
               {"role": "assistant", "content": None,
                "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
               {"role": "function", "name": "get_weather", "content": "4 degrees"},
               {"role": "user", "content": "And tomorrow?"}]
    api = parse(Endpoint.CHAT, {"messages": history, "functions": [WEATHER["function"]],
                                "function_call": "auto"})
    assert api.functions
    chat = api.request.prompt
    assert isinstance(chat, Chat)
    assert not chat.parallel_tool_calls  # one call at most
    assistant, answer = chat.messages[1], chat.messages[2]
    assert [(c.id, c.name, c.arguments) for c in assistant.tool_calls] == [
        ("call00001", "get_weather", '{"city": "Paris"}')]
    assert (answer.role, answer.name, answer.tool_call_id, answer.content) == (
        "tool", "get_weather", "call00001", "4 degrees")
    assert not parse(Endpoint.CHAT, {"messages": USER, "tools": [WEATHER]}).functions


@pytest.mark.parametrize(("message", "field"), [
    ({"role": "function", "content": "x"}, "messages[1].name"),
    ({"role": "assistant", "function_call": {"arguments": "{}"}}, "messages[1].function_call"),
    ({"role": "assistant", "function_call": {"name": "f"},
      "tool_calls": [{"id": "a", "function": {"name": "f"}}]}, "messages[1].function_call"),
])
def test_bad_legacy_history_is_refused_naming_the_field(message: dict[str, Any],
                                                        field: str) -> None:
    from tandem.router.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError) as err:
        parse(Endpoint.CHAT, {"messages": [*USER, message]})
    assert err.value.field == field
