"""Free-form (tool_choice auto) parsers on whole outputs, and choosing one."""

from __future__ import annotations

import json

import pytest

from tandem.router.tools.call import JSON_DECODER, ParsedOutput, decode_at
from tandem.router.tools.hermes import HermesToolParser
from tandem.router.tools.llama3 import Llama3JsonToolParser
from tandem.router.tools.mistral import MistralToolParser
from tandem.router.tools.select import PARSERS, parser_for

HERMES = HermesToolParser()
LLAMA = Llama3JsonToolParser()
MISTRAL = MistralToolParser()


def calls(out: ParsedOutput) -> list[tuple[str, object]]:
    """(name, decoded arguments) of each call, ids checked on the way."""
    assert all(c.id.startswith("call_") for c in out.calls)
    assert len({c.id for c in out.calls}) == len(out.calls)
    return [(c.name, json.loads(c.arguments)) for c in out.calls]


def hermes_block(name: str, arguments: object) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def test_decode_at_agrees_with_the_decoder_on_every_prefix() -> None:
    for text in [
        'x {"a": [1, {"b": "}]"}], "c": "\\"}"} tail',
        'x [1, [2], {"]": 3}] ]',
        "x {bad}",
    ]:
        try:
            whole: object = JSON_DECODER.raw_decode(text, 2)
        except ValueError:
            whole = None
        for cut in range(3, len(text) + 1):
            got = decode_at(text[:cut], 2)
            assert got is None or got == whole, (text, cut)
        assert decode_at(text, 2) == whole


# --- hermes -------------------------------------------------------------------------------


def test_hermes_single_call() -> None:
    out = HERMES.parse(hermes_block("get_weather", {"city": "Paris"}))
    assert out.content is None
    assert calls(out) == [("get_weather", {"city": "Paris"})]
    assert out.calls[0].arguments == '{"city":"Paris"}'


def test_hermes_content_then_several_calls() -> None:
    text = (
        "Let me check both.\n\n"
        + hermes_block("get_weather", {"city": "Paris"})
        + "\n"
        + hermes_block("get_time", {})
        + "\n"
    )
    out = HERMES.parse(text)
    assert out.content == "Let me check both."
    assert calls(out) == [("get_weather", {"city": "Paris"}), ("get_time", {})]


def test_hermes_plain_text_is_all_content() -> None:
    out = HERMES.parse("  No tools needed: 2 < 3 and a <b>tag</b>.  ")
    assert out == ParsedOutput("No tools needed: 2 < 3 and a <b>tag</b>.", [])
    assert HERMES.parse("") == ParsedOutput(None, [])
    assert HERMES.parse(" \n ") == ParsedOutput(None, [])


def test_hermes_unicode_nested_json_and_tags_inside_strings() -> None:
    arguments = {
        "text": 'naïve 東京 🚀 </tool_call> <tool_call> "quoted" \\',
        "nested": {"list": [1, 2.5, None, True, {"deep": ["x"]}], "empty": {}},
    }
    out = HERMES.parse("前置き " + hermes_block("write", arguments))
    assert out.content == "前置き"
    assert calls(out) == [("write", arguments)]


def test_hermes_accepts_arguments_as_a_json_string_missing_or_null() -> None:
    text = (
        '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>'
        '<tool_call>{"name": "g"}</tool_call><tool_call>{"name": "h", "arguments": null}</tool_call>'
    )
    assert calls(HERMES.parse(text)) == [("f", {"a": 1}), ("g", {}), ("h", {})]


def test_hermes_raw_control_characters_in_strings_are_tolerated() -> None:
    out = HERMES.parse('<tool_call>{"name": "f", "arguments": {"code": "a\n\tb"}}</tool_call>')
    assert calls(out) == [("f", {"code": "a\n\tb"})]
    assert out.calls[0].arguments == '{"code":"a\\n\\tb"}'


def test_hermes_unclosed_final_block_still_counts() -> None:
    out = HERMES.parse('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_')
    assert calls(out) == [("f", {"a": 1})]
    assert calls(HERMES.parse('<tool_call>{"name": "f", "arguments": {}}')) == [("f", {})]


@pytest.mark.parametrize(
    "block",
    [
        "<tool_call>\nnot json\n</tool_call>",
        '<tool_call>\n{"arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>',
        '<tool_call>\n{"arguments": {}, "name": "f"} extra\n</tool_call>',
        '<tool_call>\n["f"]\n</tool_call>',
        '<tool_call>\n{"name": "f"',
        "<tool_call>",
    ],
)
def test_hermes_malformed_blocks_stay_content(block: str) -> None:
    out = HERMES.parse("Before. " + block)
    assert out.calls == []
    assert out.content == ("Before. " + block).strip()


@pytest.mark.parametrize(
    ("block", "arguments", "content"),
    [
        # cut off by max_tokens: the arguments as far as they were written
        ('<tool_call>\n{"name": "f", "arguments": {"a": "cut', '{"a":"cut', "Before."),
        # the JSON breaks at the closing tag, which still closes the block
        ('<tool_call>\n{"name": "f", "arguments": {"a": 1</tool_call> after', '{"a":1',
         "Before.  after"),
        # it breaks elsewhere: what follows the break is content
        ('<tool_call>\n{"name": "f", "arguments": {"a": NaN}}\n</tool_call>', '{"a":',
         "Before. NaN}}\n</tool_call>"),
        # complete arguments, but no closing tag after the call object
        ('<tool_call>\n{"name": "f", "arguments": {}} extra\n</tool_call>', "{}",
         "Before.  extra\n</tool_call>"),
        # other keys after the arguments are read past, not sent
        ('<tool_call>{"name": "f", "arguments": {"a": 1}, "id": [2]}</tool_call>', '{"a":1}',
         "Before."),
    ],
)
def test_hermes_a_call_stands_once_its_name_is_read(block: str, arguments: str,
                                                    content: str) -> None:
    """Name first, arguments second: the call is streamed as it is written, so it cannot be
    taken back when its JSON later breaks or is cut off; the arguments are what was written up
    to there (a client checks them: OpenAI's own arguments may be invalid JSON). Content is
    the text outside the calls, joined, then stripped once."""
    out = HERMES.parse("Before. " + block)
    assert [(c.name, c.arguments) for c in out.calls] == [("f", arguments)]
    assert out.content == content


def test_hermes_good_calls_survive_a_malformed_neighbour() -> None:
    bad = "<tool_call>{oops}</tool_call>"
    out = HERMES.parse(hermes_block("a", {}) + "\n" + bad + "\n" + hermes_block("b", {"x": 1}))
    assert calls(out) == [("a", {}), ("b", {"x": 1})]
    assert out.content == bad


# --- llama3_json --------------------------------------------------------------------------


def test_llama_single_call_with_parameters() -> None:
    out = LLAMA.parse('{"name": "get_weather", "parameters": {"city": "Paris"}}')
    assert out.content is None
    assert calls(out) == [("get_weather", {"city": "Paris"})]


def test_llama_python_tag_and_several_calls() -> None:
    text = (
        '<|python_tag|>{"name": "a", "parameters": {"x": [1, {"y": "é"}]}}; '
        '{"name": "b", "arguments": {}};{"name": "c", "parameters": {"s": "; }"}}'
    )
    out = LLAMA.parse(text)
    assert out.content is None
    assert calls(out) == [("a", {"x": [1, {"y": "é"}]}), ("b", {}), ("c", {"s": "; }"})]


def test_llama_text_after_the_calls_is_content() -> None:
    out = LLAMA.parse('  {"name": "a", "parameters": {}}\nDone.')
    assert calls(out) == [("a", {})]
    assert out.content == "Done."


@pytest.mark.parametrize(
    "text",
    [
        'The answer: {"name": "a", "parameters": {}}',
        '{"name": "Ada", "age": 36}',
        '{"answer": 42}',
        '{"parameters": {"x": 1}, "name": "a"',
        '<|python_tag|>brave_search.call(query="weather")',
        '{"name": "a", "parameters": [1]}',
    ],
)
def test_llama_anything_else_is_content(text: str) -> None:
    assert LLAMA.parse(text) == ParsedOutput(text, [])


def test_llama_a_call_cut_off_keeps_what_was_written() -> None:
    out = LLAMA.parse('{"name": "a", "parameters": {"x": 1')
    assert [(c.name, c.arguments) for c in out.calls] == [("a", '{"x":1')]
    assert out.content is None


def test_llama_a_broken_call_after_a_good_one_is_content() -> None:
    out = LLAMA.parse('{"name": "a", "parameters": {}}; {"name": oops}')
    assert calls(out) == [("a", {})]
    assert out.content == '; {"name": oops}'


# --- mistral ------------------------------------------------------------------------------


def test_mistral_array_of_calls_after_content() -> None:
    text = (
        "Checking.[TOOL_CALLS] "
        '[{"name": "get_weather", "arguments": {"city": "Zürich"}}, {"name": "noop", "arguments": {}}]'
    )
    out = MISTRAL.parse(text)
    assert out.content == "Checking."
    assert calls(out) == [("get_weather", {"city": "Zürich"}), ("noop", {})]


def test_mistral_lone_object_and_nested_arguments() -> None:
    arguments = {"q": "[TOOL_CALLS] inside", "n": {"deep": [[1], {"a": None}]}}
    out = MISTRAL.parse("[TOOL_CALLS]" + json.dumps({"name": "search", "arguments": arguments}))
    assert out.content is None
    assert calls(out) == [("search", arguments)]


def test_mistral_name_args_form() -> None:
    text = 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]noop[ARGS]{}'
    out = MISTRAL.parse(text)
    assert out.content == "Sure."
    assert calls(out) == [("get_weather", {"city": "Paris"}), ("noop", {})]


@pytest.mark.parametrize(
    "text",
    [
        "[TOOL_CALLS]",
        "[TOOL_CALLS] not json",
        '[TOOL_CALLS][{"name": "a", "arguments": {}',
        "[TOOL_CALLS][]",
        '[TOOL_CALLS][{"name": "a", "arguments": {}}, {"arguments": {}}]',
        "[TOOL_CALLS]get_weather",
        "[TOOL_CALLS]get_weather[ARGS][1]",
        "[TOOL_CALLS]get weather[ARGS]{}",
    ],
)
def test_mistral_malformed_stays_content(text: str) -> None:
    assert MISTRAL.parse("Hi " + text) == ParsedOutput(("Hi " + text).strip(), [])


def test_mistral_args_form_cut_off_keeps_what_was_written() -> None:
    out = MISTRAL.parse('Hi [TOOL_CALLS]get_weather[ARGS]{"city": ')
    assert [(c.name, c.arguments) for c in out.calls] == [("get_weather", '{"city":')]
    assert out.content == "Hi"


def test_mistral_text_after_the_calls_is_content() -> None:
    out = MISTRAL.parse('[TOOL_CALLS][{"name": "a", "arguments": {}}] and then some')
    assert calls(out) == [("a", {})]
    assert out.content == "and then some"


# --- select -------------------------------------------------------------------------------


def test_parsers_by_name() -> None:
    assert sorted(PARSERS) == ["hermes", "llama3_json", "mistral"]
    assert all(parser.name == name for name, parser in PARSERS.items())
    assert parser_for("mistral", "{{ '<tool_call>' }}") is PARSERS["mistral"]  # the name wins
    with pytest.raises(ValueError, match="auto, hermes, llama3_json, mistral"):
        parser_for("qwen", None)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{- '<tool_call>\\n' }}{{ tool_call | tojson }}", "hermes"),
        ("{{ '[TOOL_CALLS]' }}{{ tool_calls | tojson }}", "mistral"),
        ("{{- '<|python_tag|>' }}", "llama3_json"),
        ("<|start_header_id|>ipython<|end_header_id|>", "llama3_json"),
        ("{% for m in messages %}{{ m.content }}{% endfor %}", None),
        ("", None),
        (None, None),
    ],
)
def test_parser_detected_from_the_template(template: str | None, expected: str | None) -> None:
    for name in (None, "auto"):
        parser = parser_for(name, template)
        assert (parser.name if parser else None) == expected
