"""A structured output under ``--reasoning-parser qwen3`` through real processes (router,
prefill and decode workers on a tiny random model): the thinking is free, the grammar
constrains the answer after ``</think>``, and the client gets the thinking as
``reasoning_content`` and the answer as ``content`` matching the schema, whole and streamed.

The model ends its thinking where we say: its vocabulary holds ``<think>``/``</think>`` as
one token each (Qwen3's layout, tests/data/thinking_template.py), and the rows of
``</think>`` and of the token it emits k-th on its own when greedy are swapped in its
embedding and LM head. The swap relabels two ids and changes nothing else, so the greedy
output is the free one up to k, then ``</think>``."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from safetensors.torch import load_file, save_file

from tandem.engine import SamplingParams
from tandem.launcher.local_cluster import Cluster, Proc
from tandem.router.api.chat import Chat, ChatMessage
from tandem.router.tokenizer import RouterTokenizer
from tests.data.thinking_template import END_THINK_ID, THINK_ID, thinking_tokenizer
from tests.integration.sdk_cluster import wait_until, worker_idle
from tests.integration.served_model import MODEL_ID, start_workers

SCHEMA = {"type": "object",
          "properties": {"celsius": {"type": "integer", "minimum": -50, "maximum": 60},
                         "sky": {"enum": ["clear", "cloudy", "rain"]}},
          "required": ["celsius", "sky"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA}}
QUESTION = "Weather in Paris, as JSON?"
FREE = 12  # greedy tokens looked at for the k-th


@dataclass
class Served:
    thinking: str  # the text of the free tokens before </think>
    router: Proc
    decode: Proc
    prefill: Proc


def _swap_rows(model: Path, a: int, b: int) -> None:
    """Relabel token ids ``a`` and ``b`` in the checkpoint (embedding and LM head rows)."""
    state = load_file(str(model / "model.safetensors"))
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        w = state[name].clone()
        w[[a, b]] = w[[b, a]]
        state[name] = w
    save_file(state, str(model / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def served(tiny_dir: Callable[..., Path], smollm2_dir: Path,
           tmp_path_factory: pytest.TempPathFactory,
           make_engine: Callable[..., Any]) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("thinks")
    model = root / "model"
    shutil.copytree(tiny_dir("llama", 2, vocab_size=END_THINK_ID + 1), model)
    vocab = thinking_tokenizer(smollm2_dir, root / "tokenizer", opens=True, marker_tokens=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(vocab / name, model / name)
    tokenizer = RouterTokenizer(model)
    prompt = tokenizer.encode_chat(Chat((ChatMessage("user", QUESTION),)))
    assert prompt[-2:] == [THINK_ID, tokenizer.encode("\n", add_special_tokens=False)[0]]
    engine = make_engine(model=str(model), dtype="float32", num_blocks=64)
    rid = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=FREE,
                                                    ignore_eos=True))
    free: list[int] = []
    while engine.has_unfinished():
        free += [t for out in engine.step() if out.request_id == rid for t in out.new_token_ids]
    k = next(i for i in range(2, FREE) if free[i] not in free[:i]
             and free[i] not in (*engine.eos_token_ids, THINK_ID, END_THINK_ID)
             and END_THINK_ID not in free[:i])
    _swap_rows(model, free[k], END_THINK_ID)
    c = Cluster()
    try:
        decode, prefill = start_workers(c, model, "--kv-cache-dtype", "float32")
        router = c.start("tandem.router", "--port", "0", "--tokenizer", str(model),
                         "--model-name", MODEL_ID, "--prefill", prefill.grpc,
                         "--decode", decode.grpc, "--placement", "remote",
                         "--reasoning-parser", "qwen3")
        yield Served(tokenizer.decode(free[:k]), router, decode, prefill)
    finally:
        c.stop()


@pytest.fixture(scope="module")
def client(served: Served) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"http://{served.router.info['http']}/v1", api_key="unused",
                       max_retries=0, timeout=120) as c:
        yield c


def _ask(client: openai.OpenAI, **kw: Any) -> Any:
    return client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": QUESTION}], max_tokens=120,
        temperature=0.0, response_format=FORMAT, **kw)  # type: ignore[call-overload]


def test_the_thinking_is_free_and_the_answer_matches_the_schema(
    served: Served, client: openai.OpenAI,
) -> None:
    done = _ask(client)
    message = done.choices[0].message
    assert done.choices[0].finish_reason == "stop"
    assert message.model_extra["reasoning_content"] == served.thinking
    jsonschema.validate(json.loads(message.content), SCHEMA)

    stream = _ask(client, stream=True)
    deltas = [chunk.choices[0].delta for chunk in stream if chunk.choices]
    thought = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    assert thought == served.thinking and content == message.content
    kinds = ["r" if (d.model_extra or {}).get("reasoning_content") else "c" for d in deltas
             if (d.model_extra or {}).get("reasoning_content") or d.content]
    assert kinds == sorted(kinds, reverse=True) and kinds[0] == "r"  # thinking, then answer
    wait_until(lambda: worker_idle(served.decode, "decode")
               and worker_idle(served.prefill, "prefill"))


def test_with_thinking_off_the_whole_output_is_the_answer(
    served: Served, client: openai.OpenAI,
) -> None:
    done = _ask(client, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    message = done.choices[0].message
    assert message.model_extra.get("reasoning_content") is None
    jsonschema.validate(json.loads(message.content), SCHEMA)
    wait_until(lambda: worker_idle(served.decode, "decode")
               and worker_idle(served.prefill, "prefill"))
