"""Forced tool calls: the schema the grammar engine enforces, and reading its output back."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest

from tandem.router.errors import InvalidRequestError
from tandem.router.tools.call import ToolCall, new_call_id
from tandem.router.tools.constrained import ToolParseError, choice_schema, parse_constrained
from tandem.router.tools.spec import ToolChoice, ToolSpec

WEATHER = ToolSpec(
    "get_weather",
    "Weather now",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
        "additionalProperties": False,
    },
)
NOOP = ToolSpec("noop")
TOOLS = [WEATHER, NOOP]
REQUIRED = ToolChoice("required")


def validator(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_nothing_is_forced_for_auto_or_none() -> None:
    assert choice_schema(TOOLS, ToolChoice("auto")) is None
    assert choice_schema(TOOLS, ToolChoice("none")) is None


def test_named_forces_the_arguments_object() -> None:
    schema = choice_schema(TOOLS, ToolChoice("named", "get_weather"))
    assert schema == WEATHER.parameters
    check = validator(schema)
    assert check.is_valid({"city": "Paris"})
    assert check.is_valid({"city": "Paris", "days": 3})
    assert not check.is_valid({"days": 3})
    assert not check.is_valid({"city": "Paris", "country": "FR"})
    assert not check.is_valid([{"city": "Paris"}])


def test_a_schema_without_type_still_forces_an_object() -> None:
    loose = ToolSpec("loose", None, {"properties": {"x": {"type": "integer"}}})
    check = validator(choice_schema([loose], ToolChoice("named", "loose")))
    assert check.is_valid({"x": 1}) and check.is_valid({})
    assert not check.is_valid("a string") and not check.is_valid(3)
    check = validator(choice_schema([loose], REQUIRED))
    assert not check.is_valid([{"name": "loose", "parameters": 5}])


@pytest.mark.parametrize("parallel", [True, False])
def test_required_forces_a_list_of_declared_calls(parallel: bool) -> None:
    schema = choice_schema(TOOLS, REQUIRED, parallel_tool_calls=parallel)
    check = validator(schema)
    one = {"name": "get_weather", "parameters": {"city": "Paris"}}
    two = [one, {"name": "noop", "parameters": {}}]
    assert check.is_valid([one])
    assert check.is_valid(two) is parallel
    for bad in [
        [],
        one,
        [{"name": "get_weather"}],
        [{"name": "get_weather", "parameters": {"days": 2}}],
        [{"name": "get_weather", "parameters": {"city": "Paris", "extra": 1}}],
        [{"name": "delete_everything", "parameters": {}}],
        [{**one, "id": "x"}],
        [{"name": "noop", "parameters": []}],
    ]:
        assert not check.is_valid(bad), bad


def test_required_hoists_definitions_so_references_resolve() -> None:
    point = {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}
    draw = ToolSpec(
        "draw",
        None,
        {
            "type": "object",
            "properties": {"at": {"$ref": "#/$defs/Point"}},
            "required": ["at"],
            "$defs": {"Point": point},
        },
    )
    move = ToolSpec(
        "move",
        None,
        {
            "type": "object",
            "properties": {"to": {"$ref": "#/$defs/Point"}},
            "$defs": {"Point": point},
        },
    )
    schema = choice_schema([draw, move], REQUIRED)
    assert schema["$defs"] == {"Point": point}
    check = validator(schema)
    assert check.is_valid([{"name": "draw", "parameters": {"at": {"x": 1.5}}}])
    assert not check.is_valid([{"name": "draw", "parameters": {"at": {"y": 1}}}])
    assert not check.is_valid([{"name": "move", "parameters": {"to": {"x": "far"}}}])
    # The named schema is the parameters themselves, so its references resolve as given.
    check = validator(choice_schema([draw], ToolChoice("named", "draw")))
    assert not check.is_valid({"at": {}})


def test_conflicting_definitions_are_refused() -> None:
    a = ToolSpec("a", None, {"type": "object", "$defs": {"T": {"type": "string"}}})
    b = ToolSpec("b", None, {"type": "object", "$defs": {"T": {"type": "integer"}}})
    with pytest.raises(InvalidRequestError) as e:
        choice_schema([a, b], REQUIRED)
    assert e.value.field == "tools[1].function.parameters.$defs.T"


def test_named_output_is_one_call_with_compact_arguments() -> None:
    text = '{\n  "city": "Zürich",\n  "nested": {"list": [1, {"deep": null}]}\n}'
    calls = parse_constrained(text, TOOLS, ToolChoice("named", "get_weather"))
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", '{"city":"Zürich","nested":{"list":[1,{"deep":null}]}}')
    ]
    assert json.loads(calls[0].arguments) == json.loads(text)


def test_required_output_is_one_call_per_item() -> None:
    text = json.dumps(
        [
            {"name": "get_weather", "parameters": {"city": "東京"}},
            {"name": "noop", "parameters": {}},
        ],
        ensure_ascii=False,
    )
    calls = parse_constrained(text, TOOLS, REQUIRED)
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", '{"city":"東京"}'),
        ("noop", "{}"),
    ]
    assert calls[0].id != calls[1].id
    escaped = parse_constrained('[{"name": "noop", "parameters": {"s": "\\u6771"}}]', TOOLS,
                                REQUIRED)
    assert escaped[0].arguments == '{"s":"\\u6771"}'  # as written: minified, not re-encoded


@pytest.mark.parametrize(
    ("text", "choice", "arguments"),
    [
        ('{"city": "Par', ToolChoice("named", "get_weather"), ['{"city":"Par']),  # max_tokens
        ('[{"name": "get_weather", "parameters": {"ci', REQUIRED, ['{"ci']),
        ('[{"name": "noop", "parameters": {}}, {"name": "get_weather", "parameters": {', REQUIRED,
         ["{}", "{"]),
        ('[{"name": "noop", "parameters": {}}, {"name": "get_w', REQUIRED, ["{}"]),
        ('{"city": NaN}', ToolChoice("named", "get_weather"), ['{"city":']),  # broken JSON
        ('{"city": "Paris"} trailing', ToolChoice("named", "get_weather"), ['{"city":"Paris"}']),
    ],
)
def test_an_output_cut_off_keeps_the_calls_it_opened(text: str, choice: ToolChoice,
                                                      arguments: list[str]) -> None:
    """Calls are streamed as they are written, so a call opened stands; its arguments are what
    was written before the output ended (max_tokens) or broke."""
    assert [c.arguments for c in parse_constrained(text, TOOLS, choice)] == arguments


@pytest.mark.parametrize(
    ("text", "choice"),
    [
        ("", ToolChoice("named", "get_weather")),
        ('["Paris"]', ToolChoice("named", "get_weather")),
        ("[]", REQUIRED),
        ('[{"name": "get_w', REQUIRED),
        ('{"name": "noop", "parameters": {}}', REQUIRED),
        ('[{"name": "nope", "parameters": {}}]', REQUIRED),
        ('[{"name": "noop", "parameters": "{}"}]', REQUIRED),
        ('[{"name": "noop"}]', REQUIRED),
    ],
)
def test_output_that_is_not_the_forced_json_is_a_parse_error(text: str, choice: ToolChoice) -> None:
    with pytest.raises(ToolParseError):
        parse_constrained(text, TOOLS, choice)


def test_reading_unforced_output_is_a_caller_bug() -> None:
    with pytest.raises(ValueError):
        parse_constrained("{}", TOOLS, ToolChoice("auto"))


def test_call_ids_and_wire_shape() -> None:
    ids = {new_call_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(re.fullmatch(r"call_[A-Za-z0-9]{24}", i) for i in ids)
    assert ToolCall("call_1", "f", "{}").to_dict() == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "f", "arguments": "{}"},
    }
