"""The Responses API and reasoning output with the official ``openai`` client, unchanged,
against a real router + prefill + decode (tiny model, SmolLM2's tokenizer): ``responses.create``
plain (the same greedy text as chat completions), streamed, with a tool, with text.format; and
a router of this module's own with a Qwen3-style template that opens the thinking and
``--reasoning-parser qwen3``: ``reasoning_content`` in chat (whole and streamed), reasoning
items in responses, ``enable_thinking: false`` switching it off."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import openai
import pytest

from tandem.launcher.local_cluster import Proc
from tests.data.thinking_template import thinking_tokenizer
from tests.integration.served_model import TinyWorkers, shared_router

MODEL = "tiny"
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object",
                          "properties": {"city": {"type": "string", "maxLength": 12}},
                          "required": ["city"], "additionalProperties": False}}
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                 "maximum": 9}},
          "required": ["n"], "additionalProperties": False}


def _client(proc: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{proc.info['http']}/v1", api_key="unused",
                         max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def client(tiny_router: Proc) -> Iterator[openai.OpenAI]:
    with _client(tiny_router) as c:
        yield c


@pytest.fixture(scope="module")
def thinking(tiny_workers: TinyWorkers, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[openai.OpenAI]:
    """A router of this module's own on the shared workers: the Qwen3-style template that opens
    the thinking, and the qwen3 reasoning parser."""
    directory: Path = thinking_tokenizer(tiny_workers.model, tmp_path_factory.mktemp("qwen3ish"),
                                         opens=True)
    with shared_router(tiny_workers, "--tokenizer", str(directory), "--reasoning-parser",
                       "qwen3") as router, _client(router) as c:
        yield c


def test_a_plain_response_is_the_chat_answer(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "Name a color."}],
        temperature=0.0, max_tokens=8)
    response = client.responses.create(model=MODEL, instructions="Be brief.",
                                       input="Name a color.", temperature=0.0,
                                       max_output_tokens=8)
    assert response.output_text == chat.choices[0].message.content
    assert response.status == "incomplete" and response.usage is not None
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == 8


def test_a_streamed_response_tells_the_same_text(client: openai.OpenAI) -> None:
    kw = dict(model=MODEL, input=[{"role": "user", "content": "Count to three."}],
              temperature=0.0, max_output_tokens=10)
    whole = client.responses.create(**kw)
    events = list(client.responses.create(**kw, stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == events[-1].response.output_text


def test_a_required_tool_is_a_valid_function_call_and_its_output_goes_back(
    client: openai.OpenAI,
) -> None:
    for seed in range(3):
        out = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER],
                                      tool_choice="required", parallel_tool_calls=False,
                                      temperature=1.0, max_output_tokens=120,
                                      extra_body={"seed": seed})
        (call,) = [item for item in out.output if item.type == "function_call"]
        assert call.name == "get_weather" and call.call_id
        jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    follow = client.responses.create(
        model=MODEL, tools=[WEATHER], max_output_tokens=4, temperature=0.0,
        input=[{"role": "user", "content": "Weather in Paris?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id,
                "output": "18 C, cloudy"}])
    assert follow.usage is not None and follow.usage.input_tokens > out.usage.input_tokens


def test_text_format_json_schema_holds(client: openai.OpenAI) -> None:
    out = client.responses.create(
        model=MODEL, input="A digit as JSON.", temperature=1.0, max_output_tokens=40,
        text={"format": {"type": "json_schema", "name": "digit", "schema": SCHEMA,
                         "strict": True}}, extra_body={"seed": 1})
    assert out.status == "completed"
    jsonschema.validate(json.loads(out.output_text), SCHEMA)


def test_stateless_refusals(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="keeps no responses"):
        client.responses.create(model=MODEL, input="hi", store=True)
    with pytest.raises(openai.BadRequestError, match="keeps no responses"):
        client.responses.create(model=MODEL, input="hi", previous_response_id="resp_x")


def test_reasoning_content_shows_up_and_enable_thinking_false_turns_it_off(
    thinking: openai.OpenAI,
) -> None:
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Why is the sky blue?"}],
              temperature=0.0, max_tokens=8)
    message = thinking.chat.completions.create(**kw).choices[0].message
    # a random model never closes the thinking the template opened: all of it is reasoning
    reasoning = getattr(message, "reasoning_content", None)
    assert reasoning and message.content is None
    deltas = [c.choices[0].delta for c in thinking.chat.completions.create(**kw, stream=True)
              if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == reasoning
    off = thinking.chat.completions.create(
        **kw, extra_body={"chat_template_kwargs": {"enable_thinking": False}}).choices[0]
    assert getattr(off.message, "reasoning_content", None) is None and off.message.content

    response = thinking.responses.create(model=MODEL, input="Why is the sky blue?",
                                         temperature=0.0, max_output_tokens=8)
    assert [item.type for item in response.output] == ["reasoning"]
    assert response.output[0].content[0].text == reasoning
    assert response.usage is not None
    assert response.usage.output_tokens_details.reasoning_tokens == 8


def test_a_constrained_output_is_the_answer_under_a_reasoning_parser(
    thinking: openai.OpenAI,
) -> None:
    """A grammar writes the whole output from its first token: a structured output and a
    forced call come back as the answer, never as reasoning, after a template that opened the
    thinking."""
    user = [{"role": "user", "content": "A digit as JSON."}]
    out = thinking.chat.completions.create(
        model=MODEL, messages=user, temperature=0.0, max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "d", "schema": SCHEMA}})
    assert getattr(out.choices[0].message, "reasoning_content", None) is None
    jsonschema.validate(json.loads(out.choices[0].message.content), SCHEMA)
    response = thinking.responses.create(model=MODEL, input="Weather in Paris?",
                                         tools=[WEATHER], tool_choice="required",
                                         parallel_tool_calls=False,
                                         temperature=0.0, max_output_tokens=120)
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert [item.type for item in response.output] == ["function_call"]
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
