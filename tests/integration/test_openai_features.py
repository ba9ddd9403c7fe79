"""The generation features real clients send, with the official ``openai`` package against a
real router + prefill + decode (tiny model, SmolLM2's tokenizer): structured outputs, tool
calls (forced, named, streamed), echo + prompt logprobs with max_tokens 0 (checked against
transformers), batches of prompts, logit_bias after /tokenize, /detokenize, and chat's
default max_tokens. A second router without a prefill worker serves the same decode worker
colocated: constrained greedy output is the same on both paths."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
import torch

from tandem.launcher.local_cluster import Proc
from tests.integration.sdk_cluster import wait_until, worker_stats
from tests.integration.served_model import TinyWorkers, shared_router

MODEL = "tiny"
USER = [{"role": "user", "content": "Describe a person."}]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 3},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12},
                           "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
        "required": ["zone"], "additionalProperties": False}}}


def _post(http: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """POST JSON to the router; (status, decoded body) whatever the status."""
    req = urllib.request.Request(f"http://{http}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def model(tiny_workers: TinyWorkers) -> Path:
    return tiny_workers.model


@pytest.fixture(scope="module")
def cluster(tiny_workers: TinyWorkers, tiny_router: Proc) -> Iterator[dict[str, Proc]]:
    """The shared router + prefill + decode (tests/integration/conftest.py), and a router of
    this module's own that serves colocated on the same decode worker."""
    with shared_router(tiny_workers) as colocated:
        yield {"router": tiny_router, "colocated": colocated, "prefill": tiny_workers.prefill,
               "decode": tiny_workers.decode}


def _client(proc: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{proc.info['http']}/v1", api_key="unused",
                         max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def client(cluster: dict[str, Proc]) -> Iterator[openai.OpenAI]:
    with _client(cluster["router"]) as c:
        yield c


def test_json_schema_outputs_validate_on_both_paths(cluster, client) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA,
                                                  "strict": True}}
    texts = []
    for seed in range(6):
        out = client.chat.completions.create(model=MODEL, messages=USER, temperature=1.0,
                                             seed=seed, max_tokens=120, response_format=fmt)
        assert out.choices[0].finish_reason == "stop"
        texts.append(out.choices[0].message.content)
        jsonschema.validate(json.loads(texts[-1]), SCHEMA)
    assert len(set(texts)) > 1
    greedy = {"model": MODEL, "messages": USER, "temperature": 0.0, "max_tokens": 120,
              "response_format": fmt}
    with _client(cluster["colocated"]) as colocated:
        assert (colocated.chat.completions.create(**greedy).choices[0].message.content
                == client.chat.completions.create(**greedy).choices[0].message.content)


def test_vllm_style_choice_and_regex(client) -> None:
    out = client.chat.completions.create(model=MODEL, messages=USER, temperature=1.0, seed=3,
                                         max_tokens=20, extra_body={"guided_choice": ["yes", "no"]})
    assert out.choices[0].message.content in ("yes", "no")
    out = client.completions.create(model=MODEL, prompt="Code:", temperature=1.0, seed=4,
                                    max_tokens=20,
                                    extra_body={"structured_outputs": {"regex": "[A-Z]{3}-[0-9]{2}"}})
    assert len(out.choices[0].text) == 6 and out.choices[0].text[3] == "-"


def test_a_grammar_that_does_not_compile_is_a_400_naming_it(client) -> None:
    with pytest.raises(openai.BadRequestError, match="does not compile"):
        client.chat.completions.create(model=MODEL, messages=USER, max_tokens=5,
                                       extra_body={"guided_regex": "(["})


def test_required_tool_choice_always_yields_a_valid_call(client) -> None:
    params = WEATHER["function"]["parameters"]
    for seed in range(4):
        out = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[WEATHER, TIME], tool_choice="required", temperature=1.0, seed=seed,
            max_tokens=150, parallel_tool_calls=False)
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        schema = params if call.function.name == "get_weather" else TIME["function"]["parameters"]
        jsonschema.validate(json.loads(call.function.arguments), schema)


def test_named_tool_choice_streams_the_same_call(client) -> None:
    kw = {"model": MODEL, "messages": [{"role": "user", "content": "Weather?"}],
          "tools": [WEATHER, TIME], "temperature": 0.0, "max_tokens": 150,
          "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls[0]
    assert whole.function.name == "get_weather"
    jsonschema.validate(json.loads(whole.function.arguments), WEATHER["function"]["parameters"])
    name, args, finish, pieces = None, "", None, 0
    for chunk in client.chat.completions.create(**kw, stream=True):
        for d in chunk.choices[0].delta.tool_calls or []:
            name = d.function.name or name
            args += d.function.arguments or ""
            pieces += bool(d.function.arguments)
        finish = chunk.choices[0].finish_reason or finish
    assert (name, args, finish) == ("get_weather", whole.function.arguments, "tool_calls")
    assert pieces > 1  # the arguments stream as they are written, not whole at the end


def test_tool_history_renders_and_auto_may_answer_in_text(client) -> None:
    history = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Oslo","unit":"celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees, rain"},
    ]
    out = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER],
                                         temperature=0.0, max_tokens=8)
    assert out.choices[0].finish_reason in ("length", "stop", "tool_calls")
    assert out.usage is not None and out.usage.prompt_tokens > 60  # tools + history rendered


def test_echo_prompt_logprobs_match_transformers(cluster, model) -> None:
    from transformers import AutoModelForCausalLM

    http = cluster["router"].info["http"]
    ids = _post(http, "/tokenize", {"prompt": "The capital of France is"})[1]["tokens"]
    body = {"model": MODEL, "prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 0,
            "temperature": 0}
    status, out = _post(http, "/v1/completions", body)
    assert status == 200, out
    choice = out["choices"][0]
    lp = choice["logprobs"]
    assert choice["finish_reason"] == "length" and out["usage"]["completion_tokens"] == 0
    assert len(lp["token_logprobs"]) == len(ids) and lp["token_logprobs"][0] is None
    ref = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    with torch.no_grad():
        logits = ref(torch.tensor([ids])).logits[0].float()
    want = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    got = torch.tensor(lp["token_logprobs"][1:])
    assert torch.allclose(got, want, atol=2e-3), (got - want).abs().max()
    best = torch.log_softmax(logits, -1).max(-1).values[:-1]
    tops = torch.tensor([max(t.values()) for t in lp["top_logprobs"][1:]])
    assert torch.allclose(tops, best, atol=2e-3)
    assert choice["text"].startswith("The capital of France is")


def test_a_batch_of_prompts_equals_single_requests(client) -> None:
    prompts = ["One", "Two three", "Four five six"]
    kw = {"model": MODEL, "max_tokens": 6, "temperature": 0.0, "extra_body": {"ignore_eos": True}}
    batch = client.completions.create(prompt=prompts, **kw)
    assert [c.index for c in batch.choices] == [0, 1, 2]
    singles = [client.completions.create(prompt=p, **kw).choices[0].text for p in prompts]
    assert [c.text for c in batch.choices] == singles
    assert batch.usage is not None and batch.usage.completion_tokens == 18


def test_logit_bias_after_tokenize_and_detokenize(cluster, client) -> None:
    http = cluster["router"].info["http"]
    tok = _post(http, "/tokenize", {"prompt": " Paris", "add_special_tokens": False})[1]
    assert tok["count"] == len(tok["tokens"]) >= 1 and tok["max_model_len"] > 0
    paris = tok["tokens"][0]
    out = client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, temperature=0,
                                    logit_bias={str(paris): 100},
                                    extra_body={"ignore_eos": True})
    text = _post(http, "/detokenize", {"tokens": [paris] * 3})[1]["prompt"]
    assert out.choices[0].text == text
    status, bad = _post(http, "/detokenize", {"tokens": [10**9]})
    assert status == 400 and bad["error"]["param"] == "tokens"


def test_chat_without_max_tokens_runs_to_its_end(client) -> None:
    out = client.chat.completions.create(model=MODEL, messages=USER, temperature=0.0,
                                         extra_body={"ignore_eos": True})
    usage = out.usage
    assert usage is not None and out.choices[0].finish_reason == "length"
    assert usage.prompt_tokens + usage.completion_tokens == 1024  # the whole context


def _held_nothing(cluster: dict[str, Proc]) -> bool:
    """Both shared workers hold no request and no block (nothing leaked)."""
    stats = [worker_stats(cluster[role], role) for role in ("prefill", "decode")]
    return all(s.num_running == 0 and s.num_waiting == 0 and s.num_reserved == 0
               and s.num_free_blocks == s.num_blocks and s.num_leased_blocks == 0
               for s in stats)


def test_n_is_one_fork_that_pushes_the_prompt_once_and_equals_seeded_singles(cluster, client
                                                                             ) -> None:
    """n = 4, disaggregated (--placement remote): one Reserve, one push of the prompt's
    blocks (the prefill worker's and the decode worker's KV byte counters move by exactly one
    40-token prompt's worth), four choices equal to four single requests seeded 7..10; the
    colocated router's fork gives the same; no block is left held."""
    prompts = [list(range(1000, 1040)), list(range(2000, 2040))]  # 40 tokens, nothing shared
    kw = {"model": MODEL, "max_tokens": 8, "temperature": 1.0,
          "extra_body": {"ignore_eos": True}}
    wait_until(lambda: _held_nothing(cluster))
    pushed = lambda: worker_stats(cluster["prefill"], "prefill").kv_transfer_bytes  # noqa: E731
    received = lambda: worker_stats(cluster["decode"], "decode").kv_transfer_bytes  # noqa: E731
    before = pushed()
    client.completions.create(prompt=prompts[0], seed=100, **kw)
    one_push = pushed() - before
    assert one_push > 0
    before, before_rx = pushed(), received()
    four = client.completions.create(prompt=prompts[1], n=4, seed=7, **kw)
    assert pushed() - before == one_push  # the prompt's three blocks, once
    assert received() - before_rx == one_push
    assert [c.index for c in four.choices] == [0, 1, 2, 3]
    singles = [client.completions.create(prompt=prompts[1], seed=7 + j, **kw).choices[0].text
               for j in range(4)]
    assert [c.text for c in four.choices] == singles
    assert len(set(singles)) > 1
    assert four.usage is not None and four.usage.prompt_tokens == 40
    assert four.usage.completion_tokens == 32
    with _client(cluster["colocated"]) as colocated:
        local = colocated.completions.create(prompt=prompts[1], n=4, seed=7, **kw)
    assert [c.text for c in local.choices] == singles
    wait_until(lambda: _held_nothing(cluster))  # every sequence's blocks back, none leaked


def test_n_streams_interleaved_and_best_of_picks_the_likeliest(client) -> None:
    kw = {"model": MODEL, "messages": USER, "max_tokens": 5, "temperature": 1.0, "seed": 3,
          "extra_body": {"ignore_eos": True}}
    whole = client.chat.completions.create(n=3, **kw)
    texts: dict[int, str] = {}
    for chunk in client.chat.completions.create(n=3, stream=True, **kw):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
    assert [texts[i] for i in range(3)] == [c.message.content for c in whole.choices]
    best = client.completions.create(model=MODEL, prompt="Once", max_tokens=4, temperature=1.0,
                                     seed=11, n=2, best_of=5, logprobs=0,
                                     extra_body={"ignore_eos": True})
    sums = [sum(c.logprobs.token_logprobs) for c in best.choices]
    assert len(best.choices) == 2 and sums[0] >= sums[1]
    every = [client.completions.create(model=MODEL, prompt="Once", max_tokens=4,
                                       temperature=1.0, seed=11 + j, logprobs=0,
                                       extra_body={"ignore_eos": True}).choices[0]
             for j in range(5)]
    ranked = sorted((sum(c.logprobs.token_logprobs) for c in every), reverse=True)
    assert sums == pytest.approx(ranked[:2])
