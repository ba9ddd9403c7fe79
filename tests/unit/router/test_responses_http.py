"""The Responses API (``POST /v1/responses``) through the official ``openai`` client against the
router and fake workers that send a recorded output as their text: plain and chat-style
input with instructions, streamed events in OpenAI's shapes (the stream and the whole response
agree), function calls out and their outputs back in, text.format to the grammar engine,
reasoning items, max_output_tokens, and the stateless refusals and caps."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tandem.router.tokenizer import RouterTokenizer
from tests.data.thinking_template import thinking_tokenizer
from tests.unit.router.harness import MODEL, cluster

PER_TOKEN = 3
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


def _recording(tokenizer: RouterTokenizer, recorded: str) -> Callable[[list[int]], str]:
    """A fake decode worker's text: its first token's own text, then the recording."""
    def text_of(ids: list[int]) -> str:
        return tokenizer.decode(ids[:1]) + recorded[:PER_TOKEN * (len(ids) - 1)]
    return text_of


def _tokens_for(recorded: str) -> int:
    return 1 + math.ceil(len(recorded) / PER_TOKEN)


def _client(c: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{c.router.http_port}/v1",
                              api_key="unused", max_retries=0)


def _prompt(c: Any, tokenizer: RouterTokenizer) -> str:
    """The text of the latest prompt the decode worker reserved for."""
    reservation = list(c.decode[0].reservations.values())[-1]
    return tokenizer.decode(reservation.token_ids, skip_special_tokens=False)


def test_plain_chat_style_and_streamed_input(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, http_port=0) as c:
            c.decode[0].text_of = _recording(tokenizer, "Sunny and mild, 21 C today.")
            client = _client(c)
            whole = await client.responses.create(model=MODEL, input="Weather?",
                                                  max_output_tokens=6)
            assert whole.object == "response" and whole.model == MODEL
            assert whole.status == "incomplete"
            assert whole.incomplete_details and (
                whole.incomplete_details.reason == "max_output_tokens")
            assert [item.type for item in whole.output] == ["message"]
            assert whole.output_text.endswith("Sunny and mild,")  # 5 tokens of 3 characters
            assert whole.usage and whole.usage.output_tokens == 6
            assert whole.usage.total_tokens == whole.usage.input_tokens + 6
            assert "<|im_start|>user\nWeather?<|im_end|>" in _prompt(c, tokenizer)

            stream = await client.responses.create(
                model=MODEL, instructions="Be brief.", max_output_tokens=6, stream=True,
                input=[{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                       {"type": "message", "role": "assistant", "content": "Hello!"},
                       {"role": "user", "content": "Weather?"}])
            events = [e async for e in stream]
            prompt = _prompt(c, tokenizer)
            assert prompt.index("Be brief.") < prompt.index("Hi") < prompt.index("Hello!")
            kinds = [e.type for e in events]
            assert kinds[:4] == ["response.created", "response.in_progress",
                                 "response.output_item.added", "response.content_part.added"]
            assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                                  "response.output_item.done", "response.incomplete"]
            assert [e.sequence_number for e in events] == list(range(len(events)))
            text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            final = events[-1].response
            assert final.output_text == text and text.endswith("Sunny and mild,")
            assert final.instructions == "Be brief."
            await client.close()

    asyncio.run(scenario())


def test_function_calls_out_and_outputs_back_in(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, http_port=0) as c:
            c.decode[0].text_of = _recording(tokenizer, " " + CALL)
            client = _client(c)
            kwargs: dict[str, Any] = dict(model=MODEL, input="Weather in Paris?",
                                          tools=[WEATHER], max_output_tokens=_tokens_for(CALL))
            whole = await client.responses.create(**kwargs)
            calls = [item for item in whole.output if item.type == "function_call"]
            assert len(calls) == 1 and calls[0].name == "get_weather"
            assert json.loads(calls[0].arguments) == {"city": "Paris"}
            # the first token's text (random) is the one message before the call
            assert [item.type for item in whole.output][-1] == "function_call"

            events = [e async for e in await client.responses.create(**kwargs, stream=True)]
            added = [e.item for e in events if e.type == "response.output_item.added"
                     and e.item.type == "function_call"]
            assert [a.name for a in added] == ["get_weather"] and added[0].arguments == ""
            pieces = "".join(e.delta for e in events
                             if e.type == "response.function_call_arguments.delta")
            done = [e for e in events if e.type == "response.function_call_arguments.done"]
            assert json.loads(pieces) == {"city": "Paris"} and done[0].arguments == pieces
            streamed_call = [i for i in events[-1].response.output if i.type == "function_call"]
            assert streamed_call[0].arguments == calls[0].arguments

            # the call and its output go back as input: a tool call and a tool message
            follow = [{"role": "user", "content": "Weather in Paris?"},
                      {"type": "function_call", "call_id": calls[0].call_id,
                       "name": "get_weather", "arguments": calls[0].arguments},
                      {"type": "function_call_output", "call_id": calls[0].call_id,
                       "output": "18 C and cloudy"}]
            await client.responses.create(model=MODEL, input=follow, tools=[WEATHER],
                                          max_output_tokens=2)
            prompt = _prompt(c, tokenizer)
            assert "18 C and cloudy" in prompt and "get_weather" in prompt
            await client.close()

    asyncio.run(scenario())


def test_text_format_reaches_the_grammar_engine(tokenizer: RouterTokenizer) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}

    async def scenario() -> None:
        async with cluster(tokenizer, http_port=0) as c:
            client = _client(c)
            whole = await client.responses.create(
                model=MODEL, input="JSON please", max_output_tokens=2,
                text={"format": {"type": "json_schema", "name": "a", "schema": schema,
                                 "strict": True}})
            sampling = list(c.decode[0].reservations.values())[-1].sampling
            assert json.loads(sampling.structured.json_schema) == schema
            assert whole.text and whole.text.format and whole.text.format.type == "json_schema"
            await client.close()

    asyncio.run(scenario())


def test_reasoning_comes_back_as_a_reasoning_item(tmp_path_factory: pytest.TempPathFactory
                                                  ) -> None:
    from tandem.engine.loader import resolve_model

    thinking = RouterTokenizer(thinking_tokenizer(resolve_model("smollm2"),
                                                  tmp_path_factory.mktemp("t"), opens=True))
    recorded = "\nParis is cool in spring.\n</think>\n\nAbout 18 C."

    async def scenario() -> None:
        async with cluster(thinking, http_port=0, reasoning_parser="qwen3") as c:
            c.decode[0].text_of = _recording(thinking, recorded)
            client = _client(c)
            kwargs: dict[str, Any] = dict(model=MODEL, input="Weather?",
                                          max_output_tokens=_tokens_for(recorded))
            whole = await client.responses.create(**kwargs)
            assert [item.type for item in whole.output] == ["reasoning", "message"]
            reasoning = whole.output[0]
            assert reasoning.content and reasoning.content[0].text.endswith(
                "\nParis is cool in spring.\n")
            assert whole.output_text == "\n\nAbout 18 C."
            assert whole.usage and 0 < whole.usage.output_tokens_details.reasoning_tokens < (
                whole.usage.output_tokens)

            events = [e async for e in await client.responses.create(**kwargs, stream=True)]
            thought = "".join(e.delta for e in events
                              if e.type == "response.reasoning_text.delta")
            assert thought == reasoning.content[0].text
            kinds = [e.type for e in events]
            assert kinds.index("response.reasoning_text.done") < kinds.index(
                "response.output_text.delta")
            assert events[-1].response.output_text == whole.output_text
            await client.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "hi", "store": True}, "store"),
    ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "hi", "conversation": "conv_1"}, "conversation"),
    ({"input": "hi", "background": True}, "background"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0]"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": []}, "input"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"input": "hi", "metadata": {"k": 1}}, "metadata"),
    ({"input": [{"role": "user", "content": "x"}] * 9}, "input"),  # over --max-messages
])
def test_refusals_name_the_field(tokenizer: RouterTokenizer, body: dict[str, Any],
                                 param: str) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, http_port=0, max_messages=8) as c, \
                aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{c.router.http_port}/v1/responses"
            async with http.post(url, json={"model": MODEL, **body}) as r:
                assert r.status == 400
                error = (await r.json())["error"]
            assert error["param"] == param, error
            assert not c.decode[0].reservations  # nothing reached a worker

    asyncio.run(scenario())


def test_the_client_bounds_hold_for_responses_too(tokenizer: RouterTokenizer,
                                                 tmp_path: Path) -> None:
    """A key holding its one sequence in a streamed response is refused a second (429), on
    either API; another key is served."""
    async def scenario() -> None:
        keys = tmp_path / "keys"
        keys.write_text("sk-one\nsk-two\n")
        one, two = ({"Authorization": f"Bearer sk-{k}"} for k in ("one", "two"))
        async with cluster(tokenizer, http_port=0, api_key_file=str(keys),
                           max_inflight_per_key=1) as c, aiohttp.ClientSession() as http:
            c.decode[0].hang_after = 1
            base = f"http://127.0.0.1:{c.router.http_port}/v1"
            stream = await http.post(f"{base}/responses", headers=one, json={
                "model": MODEL, "input": "Hello", "max_output_tokens": 6, "stream": True})
            assert stream.status == 200
            await asyncio.wait_for(c.decode[0].hanging.wait(), 10)
            for path, body in (("responses", {"input": "hi"}),
                               ("chat/completions", {"messages": [{"role": "user",
                                                                  "content": "hi"}]})):
                async with http.post(f"{base}/{path}", headers=one, json=body) as r:
                    assert r.status == 429
                    assert "for this API key" in (await r.json())["error"]["message"]
            async with http.post(f"{base}/responses", headers=two,
                                 json={"input": "hi", "max_output_tokens": 1}) as r:
                assert r.status == 200
            c.decode[0].resume.set()
            lines = [line async for line in stream.content if line.strip()]
            assert lines[-2].strip() == b"event: response.incomplete"
            stream.close()

    asyncio.run(scenario())
