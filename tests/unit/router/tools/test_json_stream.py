"""The incremental JSON scanner and call-head reader behind streamed tool calls: they agree
with ``json`` on what is JSON, wherever the text is split, and stop exactly where a value
ends or breaks."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from tandem.router.tools.json_stream import (
    BROKEN,
    DONE,
    OPEN,
    CallHead,
    Head,
    JsonScanner,
    read_call_head,
)


def scan(chunks: list[str]) -> tuple[str, int, str]:
    """(state, index in the joined text where reading stopped, minified text)."""
    s, out, offset = JsonScanner(), [], 0
    for chunk in chunks:
        end = s.feed(chunk)
        out.append(s.take())
        if s.state != OPEN:
            return s.state, offset + end, "".join(out)
        offset += len(chunk)
    return s.state, offset, "".join(out)


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kinds = ["int", "float", "str", "bool", "null"] + (["list", "dict"] * 2 if depth < 4 else [])
    kind = rng.choice(kinds)
    if kind == "int":
        return rng.randint(-10**6, 10**6)
    if kind == "float":
        return rng.choice([0.0, -1.5, 2.5e-8, 1e21, rng.uniform(-1e3, 1e3)])
    if kind == "str":
        return "".join(rng.choice('ab é東🚀"\\/\n\t\x01{}[],:') for _ in range(rng.randint(0, 8)))
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {f"k{i}": random_value(rng, depth + 1) for i in range(rng.randint(0, 4))}


@pytest.mark.parametrize("seed", range(30))
def test_random_values_read_the_same_however_split(seed: int) -> None:
    rng = random.Random(seed)
    value = {"root": random_value(rng)}
    text = json.dumps(value, indent=rng.choice([None, 2]), ensure_ascii=rng.random() < 0.5)
    tail = " trailing"
    whole = scan([text + tail])
    assert whole[:2] == (DONE, len(text))
    assert json.loads(whole[2]) == value
    assert scan([whole[2]]) == (DONE, len(whole[2]), whole[2])  # minified: nothing to drop
    assert scan(list(text + tail)) == whole
    cuts = sorted(rng.sample(range(len(text) + 1), k=min(6, len(text) + 1)))
    bounds = [0, *cuts, len(text) + len(tail)]
    assert scan([(text + tail)[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]) == whole


@pytest.mark.parametrize(("text", "at", "minified"), [
    ('{"a": 01}', 7, '{"a":0'),
    ('{"a": NaN}', 6, '{"a":'),
    ('{"a": [1,]}', 9, '{"a":[1,'),
    ('{"a" 1}', 5, '{"a"'),
    ('{"a": -}', 7, '{"a":-'),
    ('{"a": 1.}', 8, '{"a":1.'),
    ('{"a": 1e+}', 9, '{"a":1e+'),
    ('{"a": "\\x"}', 8, '{"a":"\\'),
    ('{"a": "\\u12g4"}', 11, '{"a":"\\u12'),
    ('{"a": tru }', 9, '{"a":tru'),
    ('{"a": 1</tool_call>', 7, '{"a":1'),
    ("{'a': 1}", 1, "{"),
    ('{"a": 1}}', 8, '{"a":1}'),  # DONE at 8: the second brace is not read
])
def test_reading_stops_where_the_json_breaks(text: str, at: int, minified: str) -> None:
    state, end, out = scan([text])
    assert (end, out) == (at, minified)
    assert state == (DONE if text.endswith("}}") else BROKEN)
    assert scan(list(text)) == (state, end, out)


def test_whitespace_goes_and_raw_control_characters_are_escaped() -> None:
    state, _, out = scan(['{ "code" :\n\t"a\nb\tc\x01" ,"n" : [ 1 , 2 ] }'])
    assert state == DONE and out == '{"code":"a\\nb\\tc\\u0001","n":[1,2]}'
    assert json.loads(out) == {"code": "a\nb\tc\x01", "n": [1, 2]}
    state, _, out = scan(['{"s": "\\u00e9\\/"}'])  # escapes stay as written
    assert out == '{"s":"\\u00e9\\/"}'


def test_the_rest_of_a_call_object_is_read_from_inside_it() -> None:
    rest = ' , "id": [1, {"x": 2}] }'
    for text, end in (("}", 1), (rest + " tail", len(rest)), ("} }", 1)):
        s = JsonScanner(in_object=True)
        assert s.feed(text) == end and s.state == DONE
    s = JsonScanner(in_object=True)
    assert s.feed(", oops") == 2 and s.state == BROKEN


def test_a_call_head_is_read_as_soon_as_it_is_complete() -> None:
    text = '  {\n "name" : "get_weather" ,\n "arguments" : {"city": "Paris"}}'
    start = text.index('{"city"')
    for cut in range(len(text) + 1):
        got = read_call_head(text[:cut], 0)
        assert got == (CallHead("get_weather", start) if cut > start else Head.MORE), cut
    assert read_call_head('{"name": "f", "parameters": {}}', 0) == CallHead("f", 28)
    assert read_call_head('{"name": "f\\u00e9", "arguments": {', 0) == CallHead("fé", 33)
    assert read_call_head('{"name": "f", "parameters": {', 0, ('"arguments"',)) is Head.NO


@pytest.mark.parametrize("text", [
    '{"arguments": {}, "name": "f"}',  # name second: read whole by the format
    '{"name": "f", "x": 1, "arguments": {}}',
    '{"name": "f", "arguments": "{}"}',  # arguments as a JSON string
    '{"name": "f", "arguments": null}',
    '{"name": "", "arguments": {}}',
    '{"name": f, "arguments": {}}',
    '{"name": "f"}',
    '["f"]',
    '{"name": "' + "x" * 300 + '", "arguments": {}}',
    '{"name": "bad\\q", "arguments": {}}',
])
def test_anything_else_is_not_a_head(text: str) -> None:
    assert read_call_head(text, 0) is Head.NO
