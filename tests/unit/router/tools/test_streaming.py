"""Streaming parsers: however the output is split, the deltas add up to what parse() returns."""

from __future__ import annotations

import json
import random

import pytest

from tandem.router.tools.call import CallDelta, ContentDelta, ToolDelta, collect
from tandem.router.tools.constrained import ConstrainedStream
from tandem.router.tools.parser import ToolParser
from tandem.router.tools.select import PARSERS
from tandem.router.tools.spec import ToolChoice, ToolSpec

HERMES, LLAMA, MISTRAL = PARSERS["hermes"], PARSERS["llama3_json"], PARSERS["mistral"]

TRICKY = {
    "s": 'é 東京 🚀 </tool_call> <tool_call> [TOOL_CALLS] ; } "q" \\',
    "n": {"l": [1, {"d": None}]},
}


def hermes(name: str, arguments: object) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments, ensure_ascii=False)}}}\n</tool_call>'


CASES: list[tuple[ToolParser, str]] = [
    (HERMES, "Just text, 2 < 3, <b>bold</b> and <tool_ nothing."),
    (HERMES, hermes("get_weather", {"city": "Paris"})),
    (HERMES, "  Let me look.\n\n" + hermes("a", {"x": 1}) + "\n" + hermes("b", TRICKY) + "\n"),
    (HERMES, hermes("a", {}) + " between " + hermes("b", {}) + " after <tool_call"),
    (HERMES, "x <tool_call>\nnot json\n</tool_call> y " + hermes("ok", {"k": [1]})),
    (HERMES, 'head <tool_call>{"name": "f", "arguments": {"a": "cut'),
    (HERMES, '<tool_call>{"name": "f", "arguments": {}} junk</tool_call>' + hermes("g", {})),
    (HERMES, '<tool_call>{"name": "f", "arguments": {"a": 1</tool_call> tail'),
    (HERMES, '<tool_call>{"name": "f", "arguments": {"a": 1}}\n</tool_'),
    (HERMES, "<tool_call><tool_call>" + hermes("f", {}) + "<tool_call>"),
    (HERMES, '<tool_call>{"name": "f", "arguments": {"a": "</tool_call>", oops}}</tool_call> rest'),
    (HERMES, '<tool_call>{"name": "f", "arguments": {"a": "x</tool_call>y\\"</tool_call>'),
    (HERMES, '<tool_call>{"name": "f", "arguments": {"code": "line 1\n\tline 2"}}</tool_call>'),
    (LLAMA, '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    (
        LLAMA,
        '\n <|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": '
        + json.dumps(TRICKY)
        + "}",
    ),
    (LLAMA, '{"name": "a", "parameters": {}}\n\nDone, see above.'),
    (LLAMA, '{"name": "a", "parameters": {}} ; {"name": broken}'),
    (LLAMA, 'The JSON is {"name": "a", "parameters": {}}'),
    (LLAMA, '{"name": "Ada", "age": 36}'),
    (LLAMA, "<|python_tag|>brave_search.call(query='x')"),
    (LLAMA, '<|python_ta {"name": "a", "parameters": {}}'),
    (
        MISTRAL,
        'Checking.[TOOL_CALLS] [{"name": "a", "arguments": '
        + json.dumps(TRICKY)
        + '}, {"name": "b", "arguments": {}}]',
    ),
    (MISTRAL, '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]noop[ARGS]{} and more'),
    (MISTRAL, "Plain [TOOL text [TOOL_CALLS]get weather[ARGS]{} [TOOL_CALLS]x[ARG"),
    (
        MISTRAL,
        '[TOOL_CALLS][{"name": "a", "arguments": {}}, {"oops": 1}] [TOOL_CALLS]{"name": "b", "arguments": {}}',
    ),
    (MISTRAL, '[TOOL_CALLS][{"name": "a", "arguments": {"cut": "'),
]
IDS = [f"{parser.name}-{i}" for i, (parser, _) in enumerate(CASES)]


def stream(parser: ToolParser, chunks: list[str]) -> list[ToolDelta]:
    s = parser.streaming()
    out: list[ToolDelta] = []
    for chunk in chunks:
        out += s.feed(chunk)
    return out + s.finish()


def assert_matches_parse(parser: ToolParser, text: str, chunks: list[str]) -> None:
    assert "".join(chunks) == text
    deltas = stream(parser, chunks)
    expected, got = parser.parse(text), collect(deltas)
    assert got.content == expected.content, chunks
    assert [(c.name, c.arguments) for c in got.calls] == [
        (c.name, c.arguments) for c in expected.calls
    ], chunks
    assert_openai_delta_shape(deltas)


def assert_openai_delta_shape(deltas: list[ToolDelta]) -> None:
    """Indices count up from 0; a call opens with id+name and empty arguments, then text only."""
    seen: list[int] = []
    for delta in deltas:
        if isinstance(delta, ContentDelta):
            assert delta.content
            continue
        if delta.index not in seen:
            assert delta.index == len(seen)
            assert delta.id and delta.name and delta.arguments == ""
            seen.append(delta.index)
        else:
            assert delta.index == seen[-1]
            assert delta.id is None and delta.name is None


@pytest.mark.parametrize(("parser", "text"), CASES, ids=IDS)
def test_every_split_point(parser: ToolParser, text: str) -> None:
    for cut in range(len(text) + 1):
        assert_matches_parse(parser, text, [text[:cut], text[cut:]])


@pytest.mark.parametrize(("parser", "text"), CASES, ids=IDS)
def test_one_character_at_a_time(parser: ToolParser, text: str) -> None:
    assert_matches_parse(parser, text, list(text))


@pytest.mark.parametrize(("parser", "text"), CASES, ids=IDS)
def test_random_multi_splits(parser: ToolParser, text: str) -> None:
    rng = random.Random(text)
    for _ in range(40):
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(2, 8))))
        bounds = [0, *cuts, len(text)]
        assert_matches_parse(
            parser, text, [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
        )


def test_the_cases_exercise_calls_and_content() -> None:
    outputs = [parser.parse(text) for parser, text in CASES]
    assert sum(len(o.calls) for o in outputs) >= 15
    assert sum(o.content is not None for o in outputs) >= 15


def test_content_streams_early_and_a_partial_tag_is_held() -> None:
    s = HERMES.streaming()
    assert s.feed("Hello wor") == [ContentDelta("Hello wor")]
    assert s.feed("ld <tool_c") == [ContentDelta("ld")]  # " " and "<tool_c" undecided
    assert s.feed("all>\n") == []
    assert s.feed('{"name": "f", "argu') == []  # the head is not complete yet
    head, brace = s.feed('ments": {')
    assert (head.index, head.name, head.arguments) == (0, "f", "")
    assert head.id is not None and head.id.startswith("call_")
    assert brace == CallDelta(0, None, None, "{")
    assert s.feed('"a": 1') == [CallDelta(0, None, None, '"a":1')]
    assert s.feed("}}\n</tool_call") == [CallDelta(0, None, None, "}")]
    assert s.feed(">\n") == []
    assert s.feed("\nbye") == [ContentDelta(" \n\nbye")]  # held whitespace, then the text
    assert s.finish() == []


def test_a_long_call_streams_its_arguments_in_many_pieces() -> None:
    """Token-sized pieces in, argument pieces out as they come: the call's id and name first,
    and no piece waits for the call to end."""
    arguments = {"text": "a long argument " * 40, "list": list(range(50))}
    text = "Sure.\n" + hermes("write", arguments)
    chunks = [text[i : i + 4] for i in range(0, len(text), 4)]
    s = HERMES.streaming()
    per_chunk = [s.feed(chunk) for chunk in chunks] + [s.finish()]
    pieces = [d for out in per_chunk for d in out if isinstance(d, CallDelta) and d.id is None]
    assert len(pieces) > 100
    first_piece = next(i for i, out in enumerate(per_chunk) if any(
        isinstance(d, CallDelta) and d.id is None for d in out))
    assert first_piece < len(chunks) // 10  # the arguments start while most is unwritten
    (call,) = HERMES.parse(text).calls
    assert "".join(d.arguments for d in pieces) == call.arguments
    assert json.loads(call.arguments) == arguments
    assert_openai_delta_shape([d for out in per_chunk for d in out])


def test_a_near_tag_is_released_when_it_turns_out_to_be_text() -> None:
    s = MISTRAL.streaming()
    assert s.feed("Use [TOOL") == [ContentDelta("Use")]
    assert s.feed("S] wisely") == [ContentDelta(" [TOOLS] wisely")]
    s = LLAMA.streaming()
    assert s.feed("  \n") == []
    assert s.feed("Sure: {") == [ContentDelta("Sure: {")]  # not at the start: never a call


def test_call_delta_wire_shape() -> None:
    assert CallDelta(0, "call_x", "f", "").to_dict() == {
        "index": 0,
        "id": "call_x",
        "type": "function",
        "function": {"name": "f", "arguments": ""},
    }
    assert CallDelta(0, None, None, '{"a":1}').to_dict() == {
        "index": 0,
        "function": {"arguments": '{"a":1}'},
    }


def test_a_broken_block_is_released_at_its_closing_tag() -> None:
    s = HERMES.streaming()
    out = s.feed('Hi <tool_call>{"name": f}</tool_call> more')
    assert collect(out).content == 'Hi <tool_call>{"name": f}</tool_call> more'
    s = HERMES.streaming()  # a closing tag inside a JSON string is argument text
    out = s.feed('<tool_call>{"name": "f", "arguments": {"a": "</tool_call> ')
    assert [(d.name, d.arguments) for d in out] == [("f", ""), (None, '{"a":"</tool_call> ')]
    out = s.feed('"}}</tool_call>')
    assert [(d.name, d.arguments) for d in out] == [(None, '"}')]
    assert s.finish() == []


FORCED_TOOLS = [ToolSpec("get_weather"), ToolSpec("noop")]
NAMED, REQUIRED = ToolChoice("named", "get_weather"), ToolChoice("required")
FORCED: list[tuple[ToolChoice, str]] = [
    (NAMED, '{"city": "Zürich \\"q\\"", "days": [1, 2.5e1], "x": {"y": null}}'),
    (REQUIRED, json.dumps([{"name": "get_weather", "parameters": {"city": TRICKY}},
                           {"name": "noop", "parameters": {}}], ensure_ascii=False)),
    (REQUIRED, '[{"name": "noop", "parameters": {"a": "cut'),
    (REQUIRED, "[]"),
    (NAMED, "not json"),
]


def forced_stream(choice: ToolChoice, chunks: list[str]) -> list[ToolDelta]:
    s = ConstrainedStream(FORCED_TOOLS, choice)
    out: list[ToolDelta] = []
    for chunk in chunks:
        out += s.feed(chunk)
    return out + s.finish()


@pytest.mark.parametrize(("choice", "text"), FORCED)
def test_forced_calls_stream_the_same_however_split(choice: ToolChoice, text: str) -> None:
    expected = collect(forced_stream(choice, [text]))
    splits = [[text[:cut], text[cut:]] for cut in range(len(text) + 1)] + [list(text)]
    for chunks in splits:
        deltas = forced_stream(choice, chunks)
        got = collect(deltas)
        assert got.content == expected.content, chunks
        assert [(c.name, c.arguments) for c in got.calls] == [
            (c.name, c.arguments) for c in expected.calls], chunks
        assert_openai_delta_shape(deltas)
    if expected.calls:
        assert expected.content is None
    else:  # no call opened: the output is content, verbatim
        assert expected.content == text


def test_a_long_forced_call_streams_its_arguments_in_many_pieces() -> None:
    arguments = {"city": "x" * 300, "days": list(range(60))}
    text = json.dumps([{"name": "get_weather", "parameters": arguments}])
    s = ConstrainedStream(FORCED_TOOLS, REQUIRED)
    per_chunk = [s.feed(text[i : i + 3]) for i in range(0, len(text), 3)] + [s.finish()]
    deltas = [d for out in per_chunk for d in out]
    head = deltas[0]
    assert isinstance(head, CallDelta) and head.name == "get_weather"
    assert sum(1 for out in per_chunk if any(isinstance(d, CallDelta) for d in out)) > 100
    (call,) = collect(deltas).calls
    assert json.loads(call.arguments) == arguments
    s = ConstrainedStream(FORCED_TOOLS, NAMED)  # named: the call opens with its first "{"
    assert s.feed(" ") == []
    assert [(d.name, d.arguments) for d in s.feed('{"ci')] == [("get_weather", ""), (None, '{"ci')]
