"""The official ``openai`` package against a real router + prefill + decode (tiny model):
completions and chat, sync and streaming, equal to the gRPC output for the same greedy
request; stop, seed and logprobs; errors in OpenAI's shape; a client that disconnects
mid-stream frees the workers' blocks."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import openai
import pytest

from tandem.launcher.local_cluster import Proc
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests.integration.sdk_cluster import (
    RouterAccess,
    paused,
    requests_with_outcome,
    wait_until,
)
from tests.integration.served_model import TinyWorkers, shared_router

MODEL = "tiny"
PROMPT = "The quick brown fox jumps over"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def cluster(tiny_workers: TinyWorkers) -> Iterator[dict[str, Proc]]:
    """This module's own router (its admission limits) on the shared tiny prefill + decode
    workers (tests/integration/conftest.py)."""
    with shared_router(
        tiny_workers, "--prefill", tiny_workers.prefill.grpc,
        "--placement", "remote",  # the same path every run, not chosen by timing
        "--max-inflight", "1", "--max-queue", "0",  # a second request at once is a 429
    ) as router:
        yield {"router": router, "prefill": tiny_workers.prefill, "decode": tiny_workers.decode}


@pytest.fixture(scope="module")
def client(cluster: dict[str, Proc]) -> Iterator[openai.OpenAI]:
    http = cluster["router"].info["http"]
    with openai.OpenAI(base_url=f"http://{http}/v1", api_key="unused", max_retries=0,
                       timeout=120) as c:
        yield c


def _grpc(cluster: dict[str, Proc], **kw: object) -> tuple[str, tandem_pb2.GenerateResponse]:
    with grpc.insecure_channel(cluster["router"].grpc) as channel:
        stub = tandem_pb2_grpc.TandemStub(channel)
        messages = list(stub.Generate(tandem_pb2.GenerateRequest(**kw), timeout=120))
    assert messages[-1].finished
    return "".join(m.text for m in messages), messages[-1]


def _greedy(n: int) -> tandem_pb2.SamplingParams:
    return tandem_pb2.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def _chat_proto() -> tandem_pb2.ChatMessages:
    return tandem_pb2.ChatMessages(messages=[tandem_pb2.ChatMessage(**m) for m in MESSAGES])


def _idle(cluster: dict[str, Proc], timeout: float = 60.0) -> None:
    """Wait until both workers hold nothing: no request, every block free."""
    deadline = time.monotonic() + timeout
    stats: list[worker_pb2.WorkerStats] = []
    while time.monotonic() < deadline:
        stats = []
        for role, stub_type in (("prefill", worker_pb2_grpc.PrefillServiceStub),
                                ("decode", worker_pb2_grpc.DecodeServiceStub)):
            with cluster[role].channel() as channel:
                stats.append(stub_type(channel).Stats(worker_pb2.StatsRequest(), timeout=30))
        if all(s.num_running == 0 and s.num_waiting == 0 and s.num_reserved == 0
               and s.num_free_blocks == s.num_blocks for s in stats):
            return
        time.sleep(0.05)  # polling a condition
    raise AssertionError(f"workers still busy: {stats}")


def test_completions_equal_grpc_sync_and_streaming(cluster, client) -> None:
    text, last = _grpc(cluster, text=PROMPT, sampling=_greedy(12))
    extra = {"ignore_eos": True}
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0,
                                    extra_body=extra)
    assert out.choices[0].text == text and out.choices[0].finish_reason == "length"
    assert out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (
        last.usage.prompt_tokens, 12)
    stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12,
                                       temperature=0, stream=True, extra_body=extra,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12
    _idle(cluster)


def test_chat_equals_grpc_sync_and_streaming(cluster, client) -> None:
    text, last = _grpc(cluster, chat=_chat_proto(), sampling=_greedy(10))
    extra = {"ignore_eos": True}
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10,
                                         temperature=0, extra_body=extra)
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == text
    assert out.usage is not None and out.usage.prompt_tokens == last.usage.prompt_tokens
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES,
                                            max_completion_tokens=10, temperature=0,
                                            stream=True, extra_body=extra)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)  # no include_usage: no usage event


def test_stop_seed_and_logprobs(cluster, client) -> None:
    text, _ = _grpc(cluster, text=PROMPT, sampling=_greedy(12))
    stop = text[len(text) // 2:][:3]
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0,
                                    stop=[stop], extra_body={"ignore_eos": True})
    assert out.choices[0].finish_reason == "stop"
    assert out.choices[0].text == text[: text.index(stop)]
    sampled = [
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0,
                                  seed=1234, extra_body={"ignore_eos": True}).choices[0].text
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1]
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0,
                                    logprobs=2, extra_body={"ignore_eos": True})
    lp = out.choices[0].logprobs
    assert lp is not None and len(lp.tokens) == 4 and len(lp.token_logprobs) == 4
    assert "".join(lp.tokens) == out.choices[0].text
    assert all(len(top) == 2 and max(top.values()) <= 0 for top in lp.top_logprobs)
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3,
                                          temperature=0, logprobs=True, top_logprobs=3,
                                          extra_body={"ignore_eos": True})
    content = chat.choices[0].logprobs.content
    assert len(content) == 3 and all(len(t.top_logprobs) == 3 for t in content)
    assert content[0].logprob == pytest.approx(content[0].top_logprobs[0].logprob)


def test_errors_in_openai_shape(cluster, client) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=MODEL, prompt=PROMPT, temperature=-1)
    assert bad.value.body["param"] == "temperature"  # type: ignore[index]
    assert bad.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as many:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, n=129)
    assert many.value.body["param"] == "n"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert missing.value.body["code"] == "model_not_found"  # type: ignore[index]
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_overload_429_and_disconnect_frees_blocks(cluster, client) -> None:
    extra = {"ignore_eos": True}
    router = cluster["router"]
    cancelled = requests_with_outcome(router, "cancelled")
    with client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=900, temperature=0,
                                   stream=True, extra_body=extra) as long:
        first = next(iter(long))
        assert first.choices[0].finish_reason is None  # mid-stream: the one slot is taken ...
        # ... and stays taken while the decode worker is paused: the stream cannot end.
        with paused(cluster["decode"], "decode", [RouterAccess(router)]):
            with pytest.raises(openai.RateLimitError) as busy:
                client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
            assert int(busy.value.response.headers["retry-after"]) >= 1
            assert busy.value.body["type"] == "rate_limit_error"  # type: ignore[index]
            long.close()  # the client goes away mid-stream
    # The closed connection cancelled the request: both legs must be released, and the
    # router counts it (after its aborts to the workers return, so possibly after they idle).
    _idle(cluster)
    wait_until(lambda: requests_with_outcome(router, "cancelled") >= cancelled + 1)
    assert requests_with_outcome(router, "cancelled") == cancelled + 1
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
    assert out.usage is not None and out.usage.completion_tokens == 2
