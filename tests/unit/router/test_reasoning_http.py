"""A reasoning model's output through the router's HTTP API (fake workers sending a recorded
output as their text, a Qwen3-style template that opens the thinking): ``reasoning_content``
whole and streamed, tool calls read from the answer only, ``chat_template_kwargs`` reaching
the template (``enable_thinking: false``), ``include_reasoning: false``, and the same output
left whole without a parser or on completions."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tandem.router.tokenizer import RouterTokenizer
from tests.data.thinking_template import thinking_tokenizer
from tests.unit.router.harness import MODEL, cluster

THINKING = "\nThe user wants Paris' weather. <tool_call>{\"name\": \"nope\"}</tool_call> no.\n"
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
ANSWER = f"\n\n<tool_call>\n{CALL}\n</tool_call>"
RECORDED = THINKING + "</think>" + ANSWER
PER_TOKEN = 3  # characters of the recording each generated token after the first stands for
MAX_TOKENS = 1 + math.ceil(len(RECORDED) / PER_TOKEN)
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
USER = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def thinking(tmp_path_factory: pytest.TempPathFactory) -> RouterTokenizer:
    from tandem.engine.loader import resolve_model

    return RouterTokenizer(thinking_tokenizer(resolve_model("smollm2"),
                                              tmp_path_factory.mktemp("qwen3ish"), opens=True))


def _recording(tokenizer: RouterTokenizer, recorded: str) -> Callable[[list[int]], str]:
    """A fake decode worker's text: its first token's own text (which the router already
    sent from the prefill reply), then the recording, PER_TOKEN characters a token."""
    def text_of(ids: list[int]) -> str:
        return tokenizer.decode(ids[:1]) + recorded[:PER_TOKEN * (len(ids) - 1)]
    return text_of


async def _events(response: aiohttp.ClientResponse) -> list[dict[str, Any]]:
    out = []
    async for raw in response.content:
        line = raw.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[len("data: "):]))
    return out


def _body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": USER, "max_tokens": MAX_TOKENS, **extra}


def test_thinking_comes_apart_whole_and_streamed_and_calls_come_from_the_answer(
    thinking: RouterTokenizer,
) -> None:
    async def scenario() -> None:
        async with cluster(thinking, http_port=0, reasoning_parser="qwen3") as c, \
                aiohttp.ClientSession() as http:
            c.decode[0].text_of = _recording(thinking, RECORDED)
            url = f"http://127.0.0.1:{c.router.http_port}/v1/chat/completions"
            async with http.post(url, json=_body(tools=[WEATHER])) as r:
                assert r.status == 200, await r.text()
                whole = (await r.json())["choices"][0]
            message = whole["message"]
            # the first token's text, then the recorded thinking (the call in it is no call)
            assert message["reasoning_content"].endswith(THINKING)
            assert message["reasoning"] == message["reasoning_content"]
            assert [(t["function"]["name"], json.loads(t["function"]["arguments"]))
                    for t in message["tool_calls"]] == [("get_weather", {"city": "Paris"})]
            assert message["content"] is None  # the answer was the call alone
            assert "</think>" not in json.dumps(whole)

            async with http.post(url, json=_body(tools=[WEATHER], stream=True)) as r:
                deltas = [e["choices"][0]["delta"] for e in await _events(r)]
            assert "".join(d.get("reasoning_content", "") for d in deltas) == (
                message["reasoning_content"])
            assert all(d.get("reasoning") == d.get("reasoning_content") for d in deltas)
            streamed = "".join(t["function"].get("arguments", "") for d in deltas
                               for t in d.get("tool_calls") or ())
            assert json.loads(streamed) == {"city": "Paris"}
            assert "".join(d.get("content") or "" for d in deltas).strip() == ""
            # thinking first, then the answer: no reasoning delta after the first call piece
            kinds = ["r" if d.get("reasoning_content") else "c" for d in deltas
                     if d.get("reasoning_content") or d.get("tool_calls")]
            assert kinds == sorted(kinds, reverse=True) and kinds[0] == "r"

            async with http.post(url, json=_body(include_reasoning=False)) as r:
                message = (await r.json())["choices"][0]["message"]
            assert "reasoning_content" not in message and message["content"] == ANSWER

    asyncio.run(scenario())


def test_chat_template_kwargs_switch_the_thinking_off(thinking: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(thinking, http_port=0, reasoning_parser="qwen3") as c, \
                aiohttp.ClientSession() as http:
            c.decode[0].text_of = _recording(thinking, "Sunny, 21 C.")
            url = f"http://127.0.0.1:{c.router.http_port}/v1/chat/completions"
            body = _body(max_tokens=5, chat_template_kwargs={"enable_thinking": False})
            async with http.post(url, json=body) as r:
                message = (await r.json())["choices"][0]["message"]
            prompt = thinking.decode(next(iter(c.decode[0].reservations.values())).token_ids,
                                     skip_special_tokens=False)
            assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
            assert message["reasoning_content"] is None
            assert message["content"].endswith("Sunny, 21 C.")
            for kwargs, field in (({"messages": []}, "chat_template_kwargs.messages"),
                                  ({"a b": 1}, "chat_template_kwargs.a b"),
                                  ({"x": {"nested": 1}}, "chat_template_kwargs.x"),
                                  ({f"k{i}": i for i in range(33)}, "chat_template_kwargs"),
                                  ([1], "chat_template_kwargs")):
                async with http.post(url, json=_body(chat_template_kwargs=kwargs)) as r:
                    assert r.status == 400
                    assert (await r.json())["error"]["param"] == field

    asyncio.run(scenario())


def test_a_constrained_output_is_the_answer(thinking: RouterTokenizer) -> None:
    """Under a template that opened the thinking, with a vocabulary whose ``</think>`` is no
    single token, a structured output comes back as the answer: the grammar wrote the whole
    output (a forced tool call, under a real grammar: tests/integration/
    test_openai_responses.py; with ``</think>`` one token the grammar waits for it:
    tests/unit/router/test_reasoning_structured.py)."""
    async def scenario() -> None:
        async with cluster(thinking, http_port=0, reasoning_parser="qwen3") as c, \
                aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{c.router.http_port}/v1/chat/completions"
            c.decode[0].text_of = _recording(thinking, '{"city": "Paris"}')
            body = _body(max_tokens=7, response_format={"type": "json_object"})
            async with http.post(url, json=body) as r:
                message = (await r.json())["choices"][0]["message"]
            assert message["reasoning_content"] is None
            assert message["content"].endswith('{"city": "Paris"}')

    asyncio.run(scenario())


@pytest.mark.parametrize("parser", ["", "qwen3"])
def test_without_a_parser_or_on_completions_the_text_is_whole(
    thinking: RouterTokenizer, parser: str,
) -> None:
    async def scenario() -> None:
        async with cluster(thinking, http_port=0, reasoning_parser=parser) as c, \
                aiohttp.ClientSession() as http:
            c.decode[0].text_of = _recording(thinking, RECORDED)
            base = f"http://127.0.0.1:{c.router.http_port}/v1"
            if not parser:
                async with http.post(f"{base}/chat/completions", json=_body()) as r:
                    message = (await r.json())["choices"][0]["message"]
                assert "reasoning_content" not in message
                assert message["content"].endswith(RECORDED)
            async with http.post(f"{base}/completions", json={
                    "model": MODEL, "prompt": "<think>\n", "max_tokens": MAX_TOKENS}) as r:
                choice = (await r.json())["choices"][0]
            assert choice["text"].endswith(RECORDED) and "reasoning_content" not in choice

    asyncio.run(scenario())


def test_an_unknown_parser_is_a_config_error(tmp_path: Path) -> None:
    from tandem.router.config import RouterConfig

    with pytest.raises(ValueError, match="reasoning_parser"):
        RouterConfig(tokenizer_dir=str(tmp_path), model_name="m", max_model_len=8,
                     reasoning_parser="granite")
