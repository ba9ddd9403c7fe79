"""``tandem generate`` / ``tandem chat`` flags for structured outputs, tools, logit bias and
logprobs, through the commands' real parsers: what the SDK is asked for, what a bad value
does (exit 2, the flag named, no traceback, no server contacted), and what prints after the
text."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tandem.cli import chat, generate
from tandem.cli.common import sampling_from_args
from tandem.cli.generation_flags import logprob_options, tool_options
from tandem.cli.reply_output import extra_lines, finish_note, print_after_text
from tandem.sdk.results import GenerateResult, TokenLogprob, ToolCall

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
SCHEMA = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
# A router address nothing listens on: a flag error must come before any call to it.
NOWHERE = ["--target", "127.0.0.1:9", "--timeout", "1"]


def options(*argv: str) -> dict[str, Any]:
    """What ``tandem generate`` passes the SDK for ``argv`` (its real parser)."""
    args = generate.build_parser().parse_args([*argv, "prompt"])
    return {**sampling_from_args(args), **tool_options(args), **logprob_options(args)}


def test_structured_output_flags_take_a_file_or_the_text(tmp_path: Path) -> None:
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCHEMA))
    expected = {"json_schema": json.dumps(SCHEMA)}
    assert options("--json-schema", str(schema_file))["structured"] == expected
    assert options("--json-schema", f"@{schema_file}")["structured"] == expected
    assert options("--json-schema", json.dumps(SCHEMA))["structured"] == expected
    grammar = tmp_path / "g.ebnf"
    grammar.write_text('root ::= "yes" | "no"')
    assert options("--grammar", str(grammar))["structured"] == {
        "grammar": 'root ::= "yes" | "no"'}
    assert options("--grammar", 'root ::= "a"')["structured"] == {"grammar": 'root ::= "a"'}
    assert options("--regex", "[0-9]+")["structured"] == {"regex": "[0-9]+"}
    assert options("--choice", "A", "--choice", "B")["structured"] == {"choice": ["A", "B"]}
    assert options("--json-object")["structured"] == {"json_object": True}
    assert "structured" not in options()


def test_tools_logit_bias_and_logprobs_flags(tmp_path: Path) -> None:
    tools_file = tmp_path / "tools.json"
    tools_file.write_text(json.dumps([WEATHER]))
    got = options("--tools", str(tools_file), "--tool-choice", "get_weather",
                  "--logit-bias", "198=-100", "--logit-bias", "7=2.5",
                  "--top-logprobs", "3")
    assert got["tools"] == [WEATHER] and got["tool_choice"] == "get_weather"
    assert got["logit_bias"] == {198: -100.0, 7: 2.5}
    assert (got["logprobs"], got["top_logprobs"]) == (True, 3)
    bare = options("--tools", json.dumps(WEATHER["function"]), "--tool-choice", "required")
    assert bare["tools"] == [WEATHER] and bare["tool_choice"] == "required"
    assert options("--logprobs")["top_logprobs"] == 0
    assert not {"tools", "tool_choice", "logit_bias", "logprobs"} & set(options())


@pytest.mark.parametrize(("argv", "flag"), [
    (["--json-schema", "{not json"], "--json-schema"),
    (["--json-schema", "[1, 2]"], "--json-schema"),
    (["--json-schema", "/no/such/schema.json"], "--json-schema"),
    (["--grammar", "/no/such/grammar.ebnf"], "--grammar"),
    (["--regex", ""], "--regex"),
    (["--json-object", "--regex", "a"], "--regex"),
    (["--logit-bias", "hello"], "--logit-bias"),
    (["--logit-bias", "-3=1"], "--logit-bias"),
    (["--logit-bias", "5=300"], "--logit-bias"),
    (["--logit-bias", "5=nan"], "--logit-bias"),
    (["--logit-bias", "5=1", "--logit-bias", "5=2"], "--logit-bias"),
    (["--tools", "[oops"], "--tools"),
    (["--tools", "[]"], "--tools"),
    (["--tools", '[{"type": "retrieval"}]'], "--tools"),
    (["--tools", '[{"type": "function", "function": {}}]'], "--tools"),
    (["--tools", "[1]"], "--tools"),
    (["--tool-choice", "auto"], "--tool-choice"),
    (["--tools", json.dumps([WEATHER]), "--tool-choice", "get_time"], "--tool-choice"),
    (["--top-logprobs", "21"], "--top-logprobs"),
    (["--top-logprobs", "three"], "--top-logprobs"),
])
@pytest.mark.parametrize("main", [generate.main, chat.main], ids=["generate", "chat"])
def test_a_bad_value_is_a_usage_error_naming_its_flag(
    main: Callable[[list[str]], int], argv: list[str], flag: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    prompt = ["hi"] if main is generate.main else []
    with pytest.raises(SystemExit) as exit_:
        main([*NOWHERE, *argv, *prompt])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(("tandem generate: error:",
                                                     "tandem chat: error:"))


def test_calls_and_logprobs_print_as_json_lines_and_the_finish_reason_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import sys

    result = GenerateResult(
        request_id="r", text="", token_ids=(5, 6), finish_reason="tool_calls",
        tool_calls=(ToolCall("call_1", "get_weather", '{"city":"Zürich"}'),),
        logprobs=(TokenLogprob(5, -0.5, ((5, -0.5), (9, -1.5))), TokenLogprob(6, -0.25)))
    lines = extra_lines(result)
    assert [json.loads(line) for line in lines] == [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city":"Zürich"}'}},
        {"token_id": 5, "logprob": -0.5, "top_logprobs": [{"token_id": 5, "logprob": -0.5},
                                                          {"token_id": 9, "logprob": -1.5}]},
        {"token_id": 6, "logprob": -0.25, "top_logprobs": []},
    ]
    assert "Zürich" in lines[0]  # readable, not \\u-escaped
    print_after_text(result, sys.stdout, sys.stderr)
    out = capsys.readouterr()
    assert out.out.splitlines() == lines and out.err == "[tool_calls]\n"
    assert finish_note("stop") is None and finish_note("") is None
    assert finish_note("length") == "[length]"
