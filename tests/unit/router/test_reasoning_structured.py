"""A structured output under a reasoning parser, through the router's HTTP API (fake workers
sending a recorded output, a Qwen3-style template that opens the thinking, ``</think>`` one
token as in Qwen3's vocabulary): the workers are asked to start the grammar after that token,
the thinking comes back as ``reasoning_content`` (whole and streamed) and the answer as
``content`` matching the schema (a forced tool call read from the answer alone); with
``enable_thinking: false``, or ``</think>`` no single token, the grammar starts at the first
token and the whole output is the answer."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from typing import Any

import aiohttp
import jsonschema
import pytest

from tandem.router.tokenizer import RouterTokenizer
from tests.data.thinking_template import END_THINK_ID, thinking_tokenizer
from tests.unit.router.harness import MODEL, cluster

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"},
                                           "celsius": {"type": "integer"}},
          "required": ["city", "celsius"], "additionalProperties": False}
THINKING = "\nParis in June: warm. {\"not\": \"the answer\"}\n"
ANSWER = '\n\n{"city": "Paris", "celsius": 21}'
RECORDED = THINKING + "</think>" + ANSWER
PER_TOKEN = 3
USER = [{"role": "user", "content": "Weather in Paris, as JSON?"}]
FORMATS = {
    "response_format": {"response_format": {"type": "json_schema", "json_schema": {
        "name": "weather", "schema": SCHEMA, "strict": True}}},
    "guided_json": {"guided_json": SCHEMA},
    "structured_outputs.regex": {"structured_outputs": {
        "regex": r'\s*\{"city": "[A-Za-z]+", "celsius": [0-9]+\}'}},
}


def _tokenizer(tmp: pytest.TempPathFactory, marker_tokens: bool) -> RouterTokenizer:
    from tandem.engine.loader import resolve_model

    return RouterTokenizer(thinking_tokenizer(resolve_model("smollm2"), tmp.mktemp("qwen3ish"),
                                              opens=True, marker_tokens=marker_tokens))


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> RouterTokenizer:
    return _tokenizer(tmp_path_factory, marker_tokens=True)


@pytest.fixture(scope="module")
def split_marker(tmp_path_factory: pytest.TempPathFactory) -> RouterTokenizer:
    return _tokenizer(tmp_path_factory, marker_tokens=False)


def _recording(tokenizer: RouterTokenizer, recorded: str) -> Callable[[list[int]], str]:
    """The fake decode worker's text: its first token's, then the recording, PER_TOKEN
    characters a token."""
    def text_of(ids: list[int]) -> str:
        return tokenizer.decode(ids[:1]) + recorded[:PER_TOKEN * (len(ids) - 1)]
    return text_of


def _body(recorded: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": USER,
            "max_tokens": 1 + math.ceil(len(recorded) / PER_TOKEN), **extra}


async def _deltas(response: aiohttp.ClientResponse) -> list[dict[str, Any]]:
    out = []
    async for raw in response.content:
        line = raw.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            out.extend(c["delta"] for c in json.loads(line[len("data: "):])["choices"])
    return out


def _asked_after(c: Any) -> list[int | None]:
    """The after_token of every structured output the decode worker was asked for."""
    return [r.sampling.structured.after_token
            if r.sampling.structured.HasField("after_token") else None
            for r in c.decode[0].reservations.values()]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_the_grammar_waits_for_the_end_of_thinking(qwen3: RouterTokenizer, fmt: str) -> None:
    async def scenario() -> None:
        async with cluster(qwen3, http_port=0, reasoning_parser="qwen3") as c, \
                aiohttp.ClientSession() as http:
            c.decode[0].text_of = _recording(qwen3, RECORDED)
            url = f"http://127.0.0.1:{c.router.http_port}/v1/chat/completions"
            async with http.post(url, json=_body(RECORDED, **FORMATS[fmt])) as r:
                assert r.status == 200, await r.text()
                message = (await r.json())["choices"][0]["message"]
            assert message["reasoning_content"].endswith(THINKING)
            jsonschema.validate(json.loads(message["content"]), SCHEMA)
            assert "</think>" not in message["content"] + message["reasoning_content"]

            async with http.post(url, json=_body(RECORDED, stream=True, **FORMATS[fmt])) as r:
                deltas = await _deltas(r)
            thought = "".join(d.get("reasoning_content") or "" for d in deltas)
            content = "".join(d.get("content") or "" for d in deltas)
            assert thought == message["reasoning_content"]
            assert content == message["content"]
            # the thinking first, then the answer
            kinds = ["r" if d.get("reasoning_content") else "c" for d in deltas
                     if d.get("reasoning_content") or d.get("content")]
            assert kinds == sorted(kinds, reverse=True) and kinds[0] == "r"
            assert _asked_after(c) == [END_THINK_ID, END_THINK_ID]

    asyncio.run(scenario())


def test_with_thinking_off_the_grammar_writes_the_whole_output(qwen3: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(qwen3, http_port=0, reasoning_parser="qwen3") as c, \
                aiohttp.ClientSession() as http:
            c.decode[0].text_of = _recording(qwen3, ANSWER)
            url = f"http://127.0.0.1:{c.router.http_port}/v1/chat/completions"
            body = _body(ANSWER, chat_template_kwargs={"enable_thinking": False},
                         **FORMATS["response_format"])
            async with http.post(url, json=body) as r:
                message = (await r.json())["choices"][0]["message"]
            assert message["reasoning_content"] is None
            assert message["content"].endswith(ANSWER)
            assert _asked_after(c) == [None]

    asyncio.run(scenario())


def test_a_marker_of_several_tokens_keeps_the_grammar_from_the_start(
    split_marker: RouterTokenizer,
) -> None:
    async def scenario() -> None:
        async with cluster(split_marker, http_port=0, reasoning_parser="qwen3") as c, \
                aiohttp.ClientSession() as http:
            c.decode[0].text_of = _recording(split_marker, ANSWER)
            url = f"http://127.0.0.1:{c.router.http_port}/v1/chat/completions"
            async with http.post(url, json=_body(ANSWER, **FORMATS["guided_json"])) as r:
                message = (await r.json())["choices"][0]["message"]
            assert message["reasoning_content"] is None
            assert message["content"].endswith(ANSWER)
            assert _asked_after(c) == [None]

    asyncio.run(scenario())


def test_without_a_structured_output_nothing_is_deferred(qwen3: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(qwen3, http_port=0, reasoning_parser="qwen3") as c, \
                aiohttp.ClientSession() as http:
            c.decode[0].text_of = _recording(qwen3, RECORDED)
            url = f"http://127.0.0.1:{c.router.http_port}/v1/chat/completions"
            async with http.post(url, json=_body(RECORDED)) as r:
                message = (await r.json())["choices"][0]["message"]
            assert message["content"] == ANSWER
            assert not any(r.sampling.HasField("structured")
                           for r in c.decode[0].reservations.values())

    asyncio.run(scenario())


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.mark.parametrize("choice", ["required", "named"])
def test_a_forced_tool_call_is_read_from_the_answer_after_the_thinking(
    qwen3: RouterTokenizer, choice: str,
) -> None:
    """tool_choice required / named: the call's grammar waits for ``</think>`` too, and the
    call is read from the answer alone (a call-like text while thinking is no call)."""
    call = ('[{"name": "get_weather", "parameters": {"city": "Paris"}}]' if choice == "required"
            else '{"city": "Paris"}')
    recorded = "\nA call? [{\"name\": \"x\"}] no.\n</think>\n\n" + call
    tool_choice: Any = ("required" if choice == "required"
                        else {"type": "function", "function": {"name": "get_weather"}})

    async def scenario() -> None:
        async with cluster(qwen3, http_port=0, reasoning_parser="qwen3") as c, \
                aiohttp.ClientSession() as http:
            c.decode[0].text_of = _recording(qwen3, recorded)
            url = f"http://127.0.0.1:{c.router.http_port}/v1/chat/completions"
            body = _body(recorded, tools=[WEATHER], tool_choice=tool_choice)
            async with http.post(url, json=body) as r:
                assert r.status == 200, await r.text()
                message = (await r.json())["choices"][0]["message"]
            assert message["reasoning_content"].endswith("\nA call? [{\"name\": \"x\"}] no.\n")
            assert [(t["function"]["name"], json.loads(t["function"]["arguments"]))
                    for t in message["tool_calls"]] == [("get_weather", {"city": "Paris"})]
            assert _asked_after(c) == [END_THINK_ID]

    asyncio.run(scenario())
