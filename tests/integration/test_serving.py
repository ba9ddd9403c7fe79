"""The whole service on localhost: router + prefill worker + decode worker(s) as real
processes on SmolLM2, driven through the public gRPC API.

Proves the handoff end to end: greedy output equals transformers generate(), disaggregated
equals colocated, concurrent streams, prefix-cache reporting, cancellation leaves no blocks
held, bad input and overload get clear status codes, and the cluster keeps serving.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil
import pytest

from tandem.launcher.local_cluster import Cluster, Proc
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests.integration.sdk_cluster import wait_until
from tests.integration.served_model import start_all
from tests.unit.engine._reference import hf_greedy

pytestmark = pytest.mark.slow

# The dequantized fp32 model: these tests compare outputs across paths (transformers,
# colocated, a migrated leg that recomputes the prompt), and the quantized default's
# few-row and many-row kernels round activations differently (docs/native_cpu.md).
ENGINE = ["--model", "smollm2", "--dtype", "float32", "--quantization", "none", "--threads", "1",
          "--num-blocks", "400"]


@pytest.fixture(scope="module")
def cluster(smollm2_dir: Path) -> Iterator[dict[str, Proc]]:
    c = Cluster()
    try:
        decode, prefill = start_all(c, ("tandem.worker.decode", "--port", "0", "--kv-port", "0", *ENGINE),
                                    ("tandem.worker.prefill", "--port", "0", *ENGINE))
        router = c.start(
            "tandem.router", "--port", "0", "--tokenizer", str(smollm2_dir), "--model-name", "smollm2",
            "--prefill", prefill.grpc, "--decode", decode.grpc, "--max-inflight", "40",
            "--max-queue", "8",
            "--placement", "remote",  # the disaggregated path every time, not by timing
        )
        yield {"router": router, "prefill": prefill, "decode": decode}
    finally:
        c.stop()


def _stub(proc: Proc) -> tandem_pb2_grpc.TandemStub:
    return tandem_pb2_grpc.TandemStub(grpc.insecure_channel(proc.grpc))


def _generate(stub, **kw) -> tuple[list[int], str, tandem_pb2.GenerateResponse]:
    """Run one Generate to its end; returns token ids, text and the last message."""
    tokens: list[int] = []
    text = ""
    last = None
    for msg in stub.Generate(tandem_pb2.GenerateRequest(**kw), timeout=300):
        tokens += list(msg.token_ids)
        text += msg.text
        last = msg
    assert last is not None and last.finished
    return tokens, text, last


def _greedy(n: int) -> tandem_pb2.SamplingParams:
    return tandem_pb2.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def _worker_stats(proc: Proc, service: str) -> worker_pb2.WorkerStats:
    channel = proc.channel()
    stub = (worker_pb2_grpc.DecodeServiceStub if service == "decode"
            else worker_pb2_grpc.PrefillServiceStub)(channel)
    return stub.Stats(worker_pb2.StatsRequest(), timeout=30)


def _assert_idle(cluster: dict[str, Proc]) -> None:
    """Both workers idle with every block free. The prefill worker frees a committed
    request's blocks just after its reply (between engine steps), so this waits for it."""
    for role in ("prefill", "decode"):
        def idle(role: str = role) -> bool:
            st = _worker_stats(cluster[role], role)
            return (st.num_running == st.num_waiting == st.num_reserved == 0
                    and st.num_free_blocks == st.num_blocks)

        try:
            wait_until(idle, timeout=60)
        except TimeoutError:
            raise AssertionError(f"{role} not idle: {_worker_stats(cluster[role], role)}") \
                from None


def test_greedy_through_router_equals_transformers(cluster, smollm2_dir) -> None:
    stub = _stub(cluster["router"])
    chat = tandem_pb2.ChatMessages(
        messages=[tandem_pb2.ChatMessage(role="user", content="What is the capital of France?")],
        add_generation_prompt=True,
    )
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir, local_files_only=True)
    chat_ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=True, add_generation_prompt=True,
    )
    if not isinstance(chat_ids, list):  # a BatchEncoding in recent transformers
        chat_ids = chat_ids["input_ids"]
    raw = "The quick brown fox jumps over"
    for kw, prompt_ids in (
        ({"chat": chat}, list(chat_ids)),
        ({"text": raw}, tok.encode(raw)),
    ):
        tokens, text, last = _generate(stub, sampling=_greedy(16), **kw)
        assert tokens == hf_greedy(smollm2_dir, prompt_ids, 16)
        assert last.usage.prompt_tokens == len(prompt_ids)
        assert last.usage.completion_tokens == 16
        assert text == tok.decode(tokens, skip_special_tokens=True)
    _assert_idle(cluster)


def test_concurrent_streams_and_prefix_cache(cluster) -> None:
    stub = _stub(cluster["router"])
    prompts = [f"Story number {i}: once upon a time" for i in range(32)]
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = _generate(stub, text=prompts[i], sampling=_greedy(8))[0]
        except BaseException as exc:  # collected and re-raised in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors[0]
    assert len(results) == 32
    # One more time, alone: identical tokens, and the shared prefix now comes from the cache.
    long_prompt = "Please summarize: " + " ".join(f"item {i} is blue." for i in range(40))
    first, _, _ = _generate(stub, text=long_prompt, sampling=_greedy(8))
    again, _, last = _generate(stub, text=long_prompt, sampling=_greedy(8))
    assert again == first
    assert last.usage.cached_tokens >= 16
    alone = _generate(stub, text=prompts[5], sampling=_greedy(8))[0]
    assert alone == results[5]
    _assert_idle(cluster)


def test_cancel_mid_decode_frees_everything(cluster) -> None:
    stub = _stub(cluster["router"])
    call = stub.Generate(
        tandem_pb2.GenerateRequest(text="Count to one thousand:", sampling=_greedy(400)),
        timeout=300,
    )
    seen = 0
    for msg in call:
        seen += len(msg.token_ids)
        if seen >= 5:
            call.cancel()
            break
    # The cancel propagates asynchronously: wait until both workers report idle.
    import time

    deadline = time.monotonic() + 60
    while True:
        try:
            _assert_idle(cluster)
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)  # polling a condition, not waiting a fixed time


@pytest.mark.parametrize(
    "kw,reason",
    [
        ({"text": ""}, "prompt"),
        ({"text": "hi", "model": "no-such-model"}, "model"),
        ({"token_ids": tandem_pb2.TokenIds(ids=[10**6])}, "vocab"),
        ({"chat": tandem_pb2.ChatMessages(messages=[tandem_pb2.ChatMessage(role="wizard",
                                                                           content="x")])},
         "role"),
        ({"text": "hi", "sampling": tandem_pb2.SamplingParams(temperature=-1)}, "temperature"),
        ({"text": "hi", "sampling": tandem_pb2.SamplingParams(top_p=0)}, "top_p"),
        ({"text": "hi", "sampling": tandem_pb2.SamplingParams(max_tokens=0)}, "max_tokens"),
        ({"text": "word " * 9000}, "prompt"),
    ],
)
def test_bad_input_is_invalid_argument_and_cluster_keeps_serving(cluster, kw, reason) -> None:
    stub = _stub(cluster["router"])
    with pytest.raises(grpc.RpcError) as err:
        _generate(stub, **kw)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason in err.value.details().lower()
    tokens, _, _ = _generate(stub, text="Hello", sampling=_greedy(2))
    assert len(tokens) == 2


def test_make_serve_path_starts_serves_and_stops() -> None:
    """``tandem local`` (what ``make serve`` runs): three processes, one endpoint, clean stop."""
    import subprocess
    import sys

    c = Cluster()
    try:
        local = c.start("tandem.launcher.local", "--port", "0", "--dtype", "float32")
        out = subprocess.run(
            [sys.executable, "-m", "tandem.cli.main", "generate", "--chat", "--target", local.grpc,
             "--max-tokens", "8", "--temperature", "0", "What is the capital of France?"],
            capture_output=True, text=True, timeout=300,
        )
        assert out.returncode == 0, out.stderr
        assert "Paris" in out.stdout
        # the default keeps the GGUF's own blocks, and says so (the workers' reports)
        stub = _stub(local)

        def reported() -> str:
            return stub.ListModels(tandem_pb2.ListModelsRequest(), timeout=30).models[0] \
                .weights_format

        wait_until(lambda: "Q4_1" in reported())
        assert reported() == "Q4_1 x120 + Q8_0 (embedding, lm_head) x1"
        # the two workers share one core-share file (the prefill worker lends its idle cores)
        lines = [p.cmdline() for p in psutil.Process(local.popen.pid).children()]
        shares = [line[line.index("--core-share") + 1] for line in lines
                  if "--core-share" in line]
        assert len(shares) == 2 and len(set(shares)) == 1
        share = Path(shares[0])
        assert share.stat().st_mode & 0o777 == 0o600
    finally:
        c.stop()
    assert local.popen.returncode == 0
    assert not share.parent.exists()  # removed with the cluster
