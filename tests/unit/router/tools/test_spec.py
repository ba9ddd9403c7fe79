"""tools / tool_choice (and the legacy functions / function_call) checked into ToolSpecs."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.router.errors import InvalidRequestError
from tandem.router.tools.spec import (
    MAX_TOOLS,
    ToolChoice,
    ToolSpec,
    parse_function_call,
    parse_functions,
    parse_request_tools,
    parse_tool_choice,
    parse_tools,
    to_template_tools,
)

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}


def tool(name: str = "get_weather", **function: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, **function}}


def test_parse_tools_reads_every_field() -> None:
    specs = parse_tools(
        [
            tool(description="Weather now", parameters=WEATHER, strict=True),
            tool("noop"),
        ]
    )
    assert specs == [
        ToolSpec("get_weather", "Weather now", WEATHER, True),
        ToolSpec("noop", None, {"type": "object", "properties": {}}, False),
    ]


def test_absent_or_empty_tools_are_no_tools() -> None:
    assert parse_tools(None) == []
    assert parse_tools([]) == []


def test_names_up_to_64_of_the_allowed_characters() -> None:
    name = "a-Z_0" * 12 + "abcd"
    assert len(name) == 64
    assert parse_tools([tool(name)])[0].name == name


def test_the_tool_limit_is_openais() -> None:
    assert len(parse_tools([tool(f"t{i}") for i in range(MAX_TOOLS)])) == MAX_TOOLS
    with pytest.raises(InvalidRequestError) as e:
        parse_tools([tool(f"t{i}") for i in range(MAX_TOOLS + 1)])
    assert e.value.field == "tools"


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"type": "function"}, "tools"),
        ([42], "tools[0]"),
        ([tool(), {"type": "retrieval", "function": {"name": "x"}}], "tools[1].type"),
        ([{"type": "function"}], "tools[0].function"),
        ([{"type": "function", "function": "get_weather"}], "tools[0].function"),
        ([{"type": "function", "function": {}}], "tools[0].function.name"),
        ([tool("has space")], "tools[0].function.name"),
        ([tool("dotted.name")], "tools[0].function.name"),
        ([tool("")], "tools[0].function.name"),
        ([tool("x" * 65)], "tools[0].function.name"),
        ([tool(7)], "tools[0].function.name"),  # type: ignore[arg-type]
        ([tool(), tool("b"), tool()], "tools[2].function.name"),
        ([tool(parameters="{}")], "tools[0].function.parameters"),
        ([tool(parameters=[])], "tools[0].function.parameters"),
        ([tool(description=3)], "tools[0].function.description"),
        ([tool(strict="yes")], "tools[0].function.strict"),
    ],
)
def test_bad_tools_name_the_field(raw: Any, field: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        parse_tools(raw)
    assert e.value.field == field


def test_legacy_functions_are_the_same_specs() -> None:
    assert parse_functions([{"name": "get_weather", "parameters": WEATHER}]) == [
        ToolSpec("get_weather", None, WEATHER)
    ]
    with pytest.raises(InvalidRequestError) as e:
        parse_functions([{"name": "a"}, {"name": "a"}])
    assert e.value.field == "functions[1].name"


def test_tool_choice_defaults_to_auto_with_tools_and_none_without() -> None:
    specs = parse_tools([tool()])
    assert parse_tool_choice(None, specs) == ToolChoice("auto")
    assert parse_tool_choice(None, []) == ToolChoice("none")
    assert parse_tool_choice("auto", []) == ToolChoice("none")
    assert parse_tool_choice("none", specs) == ToolChoice("none")


def test_tool_choice_modes() -> None:
    specs = parse_tools([tool(), tool("other")])
    assert parse_tool_choice("required", specs) == ToolChoice("required")
    named = parse_tool_choice({"type": "function", "function": {"name": "other"}}, specs)
    assert named == ToolChoice("named", "other")
    assert named.constrained and ToolChoice("required").constrained
    assert not ToolChoice("auto").constrained and not ToolChoice("none").constrained


@pytest.mark.parametrize(
    ("raw", "tools", "field"),
    [
        ("required", [], "tool_choice"),
        ("always", ["get_weather"], "tool_choice"),
        (True, ["get_weather"], "tool_choice"),
        (
            {"type": "function", "function": {"name": "nope"}},
            ["get_weather"],
            "tool_choice.function.name",
        ),
        (
            {"type": "function", "function": {"name": "get_weather"}},
            [],
            "tool_choice.function.name",
        ),
        ({"type": "function", "function": {}}, ["get_weather"], "tool_choice.function.name"),
        ({"type": "function", "function": "get_weather"}, ["get_weather"], "tool_choice.function"),
        ({"function": {"name": "get_weather"}}, ["get_weather"], "tool_choice.type"),
    ],
)
def test_bad_tool_choice_names_the_field(raw: Any, tools: list[str], field: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        parse_tool_choice(raw, parse_tools([tool(name) for name in tools]))
    assert e.value.field == field


def test_legacy_function_call() -> None:
    specs = parse_functions([{"name": "f"}])
    assert parse_function_call("none", specs) == ToolChoice("none")
    assert parse_function_call("auto", specs) == ToolChoice("auto")
    assert parse_function_call({"name": "f"}, specs) == ToolChoice("named", "f")
    for raw, field in [("required", "function_call"), ({"name": "g"}, "function_call.name")]:
        with pytest.raises(InvalidRequestError) as e:
            parse_function_call(raw, specs)
        assert e.value.field == field


def test_request_tools_from_a_body() -> None:
    request = parse_request_tools({"tools": [tool()], "tool_choice": "required"})
    assert request.tools == parse_tools([tool()])
    assert request.choice == ToolChoice("required")
    assert request.parallel_tool_calls and not request.legacy
    assert not parse_request_tools(
        {"tools": [tool()], "parallel_tool_calls": False}
    ).parallel_tool_calls
    assert parse_request_tools({"messages": []}).choice == ToolChoice("none")


def test_legacy_request_allows_one_call() -> None:
    request = parse_request_tools({"functions": [{"name": "f"}], "function_call": {"name": "f"}})
    assert request.legacy and not request.parallel_tool_calls
    assert request.choice == ToolChoice("named", "f")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tools": [tool()], "functions": [{"name": "f"}]}, "functions"),
        ({"tools": [tool()], "tool_choice": "auto", "function_call": "auto"}, "function_call"),
        ({"tools": [tool()], "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ],
)
def test_bad_request_tools(body: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        parse_request_tools(body)
    assert e.value.field == field


def test_template_tools_are_openai_shaped() -> None:
    specs = parse_tools([tool(description="Weather now", parameters=WEATHER), tool("noop")])
    assert to_template_tools(specs) == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather now",
                "parameters": WEATHER,
            },
        },
        {
            "type": "function",
            "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}},
        },
    ]
