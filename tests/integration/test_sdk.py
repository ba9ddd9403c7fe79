"""``tandem.Client`` and ``tandem.AsyncClient`` against a real router with real workers (tiny
model), and the retry rules against a real grpc.aio server that fails on purpose.

Proves: generate and streaming agree; stopping a stream early cancels the RPC and the
workers end holding no KV block; each typed error on its status (bad request, tiny deadline,
full router, dead target, missing API key, a stream cancelled under a reader); TLS with an
API key; retries only where the rules allow them; a request's id both ways (the caller's sent
in the request and as ``x-request-id`` metadata, the router's echo on results and failures).
"""

from __future__ import annotations

import asyncio
import re
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

import tandem
from tandem.launcher.local_cluster import Proc
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc
from tests.integration.sdk_cluster import (
    LocalCluster,
    assert_idle,
    requests_with_outcome,
    start_router_on,
    wait_until,
)
from tests.integration.served_model import TinyWorkers
from tests.integration.tls_certs import make_certs

GREEDY = {"temperature": 0.0, "ignore_eos": True}
ROUTER_ID = re.compile(r"[0-9a-f]{32}")  # the id the router mints when the caller names none
LONG = 900  # tokens a stream would take to finish on its own: far more than any test reads


@pytest.fixture(scope="module")
def local(tiny_workers: TinyWorkers) -> Iterator[LocalCluster]:
    """A router of this module's own on the shared tiny workers (stopped with the module)."""
    lc = start_router_on(tiny_workers)
    try:
        yield lc
    finally:
        lc.cluster.stop()


@pytest.fixture(scope="module")
def edge_router(
    local: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Proc, str, Path]:
    """A second router over the same workers with API keys and TLS on its public port, that
    admits one request and queues none; returns it, the key and the CA."""
    d = tmp_path_factory.mktemp("edge")
    keys = d / "keys.txt"
    keys.write_text("# accepted keys\nsk-test-123\n")
    certs = make_certs(d)
    proc = local.start_router(
        "--api-key-file", str(keys), "--tls-cert", str(certs.server_cert),
        "--tls-key", str(certs.server_key), "--max-inflight", "1", "--max-queue", "0",
        # Every request here shares the one key, whose own bound (--max-inflight's by
        # default) would refuse before admission does: off, so admission's refusal is seen.
        "--max-inflight-per-key", "0",
        ca=certs.ca, api_key="sk-test-123",
    )
    return proc, "sk-test-123", certs.ca


def _cancelled(local: LocalCluster) -> float:
    assert local.router is not None
    return requests_with_outcome(local.router, "cancelled")


def _wait_cancelled(local: LocalCluster, count: float) -> None:
    """The router counted ``count`` cancelled requests (it records the outcome as the
    cancellation reaches it, asynchronously)."""
    wait_until(lambda: _cancelled(local) >= count, timeout=60)
    assert _cancelled(local) == count


# --------------------------------------------------------------- generate and streaming


def test_sync_generate_stream_tokenize_models_health(local: LocalCluster) -> None:
    with tandem.Client(local.target) as client:
        assert client.health()
        assert client.models() == [tandem.ModelInfo("tiny", 1024, "tandem")]
        result = client.generate("The quick brown fox", max_tokens=12, **GREEDY)
        assert isinstance(result, tandem.GenerateResult)
        assert len(result.token_ids) == 12 and result.finish_reason == "length"
        assert result.usage.completion_tokens == 12
        assert result.usage.prompt_tokens == len(client.tokenize("The quick brown fox"))
        assert result.timings.total_s >= result.timings.first_token_s > 0
        with client.generate_stream("The quick brown fox", max_tokens=12, **GREEDY) as stream:
            chunks = list(stream)
        assert "".join(c.text for c in chunks) == result.text
        assert tuple(t for c in chunks for t in c.token_ids) == result.token_ids
        assert chunks[-1].finished and chunks[-1].usage == result.usage
        assert all(not c.finished and c.usage is None for c in chunks[:-1])
        chat = [{"role": "user", "content": "Hello!"}]
        by_chat = client.generate(messages=chat, max_tokens=6, **GREEDY)
        assert by_chat.usage.prompt_tokens == len(client.tokenize(messages=chat))
        assert client.generate(token_ids=client.tokenize(messages=chat), max_tokens=6,
                               **GREEDY).token_ids == by_chat.token_ids
    assert_idle(local)


def test_request_ids_are_echoed_on_results_and_chunks(local: LocalCluster) -> None:
    """The caller's id comes back on the result and on every chunk; without one, the id the
    router minted (the one its log lines carry), a new one per request."""
    with tandem.Client(local.target) as client:
        named = client.generate("Hi", max_tokens=2, request_id="sdk-it/7", **GREEDY)
        assert named.request_id == "sdk-it/7"
        chunks = list(client.generate_stream("Hi", max_tokens=2, request_id="sdk-it/8",
                                             **GREEDY))
        assert chunks and {c.request_id for c in chunks} == {"sdk-it/8"}
        first, second = (client.generate("Hi", max_tokens=2, **GREEDY) for _ in range(2))
        assert ROUTER_ID.fullmatch(first.request_id) and ROUTER_ID.fullmatch(second.request_id)
        assert first.request_id != second.request_id

    async def run() -> tuple[str, set[str]]:
        async with tandem.AsyncClient(local.target) as client:
            result = await client.generate("Hi", max_tokens=2, request_id="sdk-it/9", **GREEDY)
            ids = {c.request_id async for c in client.generate_stream(
                "Hi", max_tokens=2, request_id="sdk-it/10", **GREEDY)}
            return result.request_id, ids

    assert asyncio.run(run()) == ("sdk-it/9", {"sdk-it/10"})
    assert_idle(local)


def test_async_generate_and_stream_equal_sync(local: LocalCluster) -> None:
    with tandem.Client(local.target) as client:
        expected = client.generate("Once upon a time", max_tokens=10, **GREEDY)

    async def run() -> tuple[tandem.GenerateResult, list[tandem.StreamChunk], list[int], bool]:
        async with tandem.AsyncClient(local.target) as client:
            result = await client.generate("Once upon a time", max_tokens=10, **GREEDY)
            stream = client.generate_stream("Once upon a time", max_tokens=10, **GREEDY)
            chunks = [c async for c in stream]
            return result, chunks, await client.tokenize("Once upon a time"), \
                await client.health()

    result, chunks, ids, healthy = asyncio.run(run())
    assert result.token_ids == expected.token_ids and result.text == expected.text
    assert "".join(c.text for c in chunks) == expected.text and chunks[-1].finished
    assert len(ids) == result.usage.prompt_tokens and healthy


# --------------------------------------------------------------- cancellation frees blocks


def test_sync_stream_break_cancels_and_frees_blocks(local: LocalCluster) -> None:
    before = _cancelled(local)
    with tandem.Client(local.target) as client:
        seen = 0
        for chunk in client.generate_stream("Count forever:", max_tokens=LONG, **GREEDY):
            seen += len(chunk.token_ids)
            if seen >= 3:
                break  # the stream object is dropped here: that alone must cancel the RPC
        assert_idle(local)
        _wait_cancelled(local, before + 1)
        # close() on a stream held in a variable, mid-way.
        stream = client.generate_stream("Count again:", max_tokens=LONG, **GREEDY)
        next(stream)
        stream.close()
        assert list(stream) == []
        assert_idle(local)
        _wait_cancelled(local, before + 2)


def test_async_stream_aclose_and_break_cancel(local: LocalCluster) -> None:
    before = _cancelled(local)

    async def run() -> None:
        async with tandem.AsyncClient(local.target) as client:
            stream = client.generate_stream("Count forever:", max_tokens=LONG, **GREEDY)
            await stream.__anext__()
            await stream.aclose()
            assert [c async for c in stream] == []
            await asyncio.to_thread(assert_idle, local)
            async for _chunk in client.generate_stream("Again:", max_tokens=LONG, **GREEDY):
                break
            await asyncio.to_thread(assert_idle, local)

    asyncio.run(run())
    _wait_cancelled(local, before + 2)


def _reading_in_grpc(thread: threading.Thread) -> bool:
    """``thread`` is inside grpc's blocking read of the next message."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if "grpc" in frame.f_code.co_filename and frame.f_code.co_name == "_next":
            return True
        frame = frame.f_back
    return False


def test_stream_closed_under_a_reader_ends_the_reader(local: LocalCluster) -> None:
    """close() from another thread while a reader iterates: the reader ends at once, with
    Cancelled when it sat in a read, quietly when it came back for a chunk after close()
    (chunks already received may still be handed out, so which of the two is a race; neither
    may hang or raise anything else), and the router counts the request cancelled with every
    block freed. The decode worker is paused meanwhile: the stream cannot end on its own."""
    before = _cancelled(local)
    with tandem.Client(local.target) as client:
        stream = client.generate_stream("Tick tock", max_tokens=LONG, **GREEDY)
        outcome: list[BaseException | None] = []
        got_two = threading.Event()

        def read() -> None:
            try:
                for n, _ in enumerate(stream):
                    if n == 1:
                        got_two.set()
                outcome.append(None)
            except BaseException as exc:  # handed to the test thread
                outcome.append(exc)

        reader = threading.Thread(target=read)
        reader.start()
        assert got_two.wait(60)
        with local.paused_decode():
            wait_until(lambda: _reading_in_grpc(reader), timeout=60)
            stream.close()
            reader.join(60)
            assert not reader.is_alive()
    assert len(outcome) == 1, outcome
    assert outcome[0] is None or isinstance(outcome[0], tandem.Cancelled), outcome
    _wait_cancelled(local, before + 1)
    assert_idle(local)


# --------------------------------------------------------------- typed errors


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": -1.0}, {"model": "no-such-model"}, {"top_p": 0.0},
     # Ids the router refuses; one gRPC metadata cannot carry travels in the request alone.
     {"request_id": "two words"}, {"request_id": "caf\u00e9"}, {"request_id": "x" * 129}],
)
def test_bad_request_is_invalid_request(local: LocalCluster, kwargs) -> None:
    with tandem.Client(local.target) as client:
        with pytest.raises(tandem.InvalidRequest) as err:
            client.generate("hi", max_tokens=2, **kwargs)
        assert err.value.code == "INVALID_ARGUMENT"
        assert err.value.request_id == ""  # refused before the router named the request
        if "request_id" in kwargs:
            assert "request_id" in err.value.message
        with pytest.raises(tandem.InvalidRequest):
            next(iter(client.generate_stream("hi", max_tokens=2, **kwargs)))


def test_tiny_deadline_is_deadline_exceeded(local: LocalCluster) -> None:
    with tandem.Client(local.target, timeout_s=0.05) as client:
        with pytest.raises(tandem.DeadlineExceeded):
            client.generate("slow", max_tokens=LONG, **GREEDY)
        with pytest.raises(tandem.DeadlineExceeded):
            list(client.generate_stream("slow", max_tokens=LONG, **GREEDY))

    async def run() -> None:
        async with tandem.AsyncClient(local.target) as client:
            with pytest.raises(tandem.DeadlineExceeded):
                await client.generate("slow", max_tokens=LONG, timeout=0.05, **GREEDY)

    asyncio.run(run())
    assert_idle(local)


def test_full_router_is_overloaded_with_retry_after(local: LocalCluster, edge_router) -> None:
    proc, key, ca = edge_router
    edge = {"tls": tandem.TLSConfig(ca_cert=str(ca)), "api_key": key}
    no_retry = tandem.RetryPolicy(max_attempts=1)
    with tandem.Client(proc.grpc, **edge) as client, \
            tandem.Client(proc.grpc, retry=no_retry, **edge) as second:
        holder = client.generate_stream("Hold the slot", max_tokens=LONG, **GREEDY)
        next(holder)  # admitted and streaming: the router's one slot is taken ...
        with local.paused_decode():  # ... and stays taken: the holder cannot finish now
            # Refused in the router's admission, after it named the request: the failure
            # says which request it was (the caller's id, else the router's).
            with pytest.raises(tandem.Overloaded) as err:
                second.generate("one more", max_tokens=2, request_id="sdk-busy-1")
            assert err.value.retry_after_s == pytest.approx(0.2)
            assert err.value.request_id == "sdk-busy-1"
            assert str(err.value).endswith("(request_id=sdk-busy-1)")
            with pytest.raises(tandem.Overloaded) as err:
                next(iter(second.generate_stream("one more", max_tokens=2)))
            assert ROUTER_ID.fullmatch(err.value.request_id)

            async def run() -> None:
                async with tandem.AsyncClient(proc.grpc, retry=no_retry, **edge) as aclient:
                    with pytest.raises(tandem.Overloaded) as aerr:
                        await aclient.generate("one more", max_tokens=2, request_id="sdk-busy-2")
                    assert aerr.value.retry_after_s == pytest.approx(0.2)
                    assert aerr.value.request_id == "sdk-busy-2"
                    with pytest.raises(tandem.Overloaded) as aerr:
                        await aclient.generate_stream("one more", max_tokens=2).__anext__()
                    assert ROUTER_ID.fullmatch(aerr.value.request_id)

            asyncio.run(run())
        holder.close()
        # The slot frees once the cancel lands; Overloaded with retry info is retried, so
        # this succeeds without the test waiting itself (the call's deadline bounds a hang).
        patient = tandem.RetryPolicy(max_attempts=10**6, initial_backoff_s=0.05,
                                     max_backoff_s=0.2)
        with tandem.Client(proc.grpc, retry=patient, timeout_s=120.0, **edge) as third:
            assert len(third.generate("now", max_tokens=2, **GREEDY).token_ids) == 2
    assert_idle(local)


@contextmanager
def _refusing_port() -> Iterator[int]:
    """A port bound for the block but never listening: connecting to it is refused, and no
    other process can take it meanwhile (a port picked free and released could be)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def test_dead_target_is_unavailable_after_bounded_retries() -> None:
    """Three refused attempts, then Unavailable: long before the 60 s deadline a client that
    kept retrying would reach."""
    policy = tandem.RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02)
    with _refusing_port() as port:
        target = f"127.0.0.1:{port}"
        with tandem.Client(target, timeout_s=60.0, retry=policy) as client:
            start = time.monotonic()
            with pytest.raises(tandem.Unavailable):
                client.models()
            with pytest.raises(tandem.Unavailable):
                list(client.generate_stream("hi"))
            assert time.monotonic() - start < 60.0

        async def run() -> None:
            async with tandem.AsyncClient(target, timeout_s=60.0, retry=policy) as client:
                with pytest.raises(tandem.Unavailable):
                    await client.generate("hi")

        asyncio.run(run())


def test_missing_or_wrong_api_key_is_auth_error_and_tls_works(edge_router) -> None:
    proc, key, ca = edge_router
    tls = tandem.TLSConfig(ca_cert=str(ca))
    with tandem.Client(proc.grpc, tls=tls, api_key=key) as client:
        assert client.generate("hello", max_tokens=3, **GREEDY).usage.completion_tokens == 3
        assert [m.id for m in client.models()] == ["tiny"]
    for bad_key in (None, "sk-wrong"):
        with tandem.Client(proc.grpc, tls=tls, api_key=bad_key) as client:
            for call in (lambda c: c.generate("hello", max_tokens=3),
                         lambda c: list(c.generate_stream("hello", max_tokens=3)),
                         lambda c: c.tokenize("hello"),
                         lambda c: c.models()):
                with pytest.raises(tandem.AuthError):
                    call(client)
            assert client.health()  # health stays open for probes

    async def run() -> None:
        async with tandem.AsyncClient(proc.grpc, tls=tls) as client:
            with pytest.raises(tandem.AuthError):
                await client.generate("hello", max_tokens=3)

    asyncio.run(run())
    # A plaintext client cannot talk to the TLS port at all.
    with tandem.Client(proc.grpc, api_key=key, timeout_s=5.0,
                       retry=tandem.RetryPolicy(max_attempts=1)) as plain:
        with pytest.raises(tandem.Unavailable):
            plain.models()


def test_environment_target_and_key_reach_the_router(
    edge_router, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TANDEM_TARGET and TANDEM_API_KEY stand in for the arguments (sync and async); an
    explicit ``api_key=None`` still sends no key."""
    proc, key, ca = edge_router
    monkeypatch.setenv("TANDEM_TARGET", proc.grpc)
    monkeypatch.setenv("TANDEM_API_KEY", key)
    tls = tandem.TLSConfig(ca_cert=str(ca))
    with tandem.Client(tls=tls) as client:
        assert client.config.target == proc.grpc
        assert [m.id for m in client.models()] == ["tiny"]

    async def run() -> list[str]:
        async with tandem.AsyncClient(tls=tls) as client:
            return [m.id for m in await client.models()]

    assert asyncio.run(run()) == ["tiny"]
    with tandem.Client(tls=tls, api_key=None) as client, pytest.raises(tandem.AuthError):
        client.models()


# --------------------------------------------------------------- retries, real server


class FlakyTandem(tandem_pb2_grpc.TandemServicer):
    """Fails on purpose: ``plan`` lists, per call, what each attempt does."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.plan: dict[str, list[str]] = {}
        self.generate_metadata: list[dict[str, str]] = []  # each Generate call's, in order

    def _next(self, method: str) -> str:
        n = self.calls.get(method, 0)
        self.calls[method] = n + 1
        steps = self.plan.get(method, [])
        return steps[n] if n < len(steps) else "ok"

    async def ListModels(self, request, context):  # noqa: N802
        step = self._next("ListModels")
        if step == "unavailable":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
        if step == "busy-retry":
            context.set_trailing_metadata((("retry-after-ms", "50"),))
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "full")
        if step == "busy":
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "full, no retry info")
        if step == "unauthenticated":
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "no key")
        return tandem_pb2.ListModelsResponse(models=[tandem_pb2.ModelInfo(id="flaky")])

    async def Generate(self, request, context) -> AsyncIterator[tandem_pb2.GenerateResponse]:  # noqa: N802
        step = self._next("Generate")
        self.generate_metadata.append(dict(context.invocation_metadata() or ()))
        if step == "unavailable":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no worker yet")
        yield tandem_pb2.GenerateResponse(request_id="r", token_ids=[1], text="a")
        if step == "fail-after-first":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "worker lost mid-stream")
        yield tandem_pb2.GenerateResponse(
            request_id="r", token_ids=[2], text="b", finished=True, finish_reason="length",
            usage=tandem_pb2.Usage(prompt_tokens=1, completion_tokens=2))


@pytest.fixture()
def flaky() -> Iterator[tuple[FlakyTandem, str]]:
    """A grpc.aio server on its own event-loop thread, stopped after the test."""
    servicer = FlakyTandem()
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def serve() -> None:
        state["loop"], state["stop"] = asyncio.get_running_loop(), asyncio.Event()
        server = grpc.aio.server()
        tandem_pb2_grpc.add_TandemServicer_to_server(servicer, server)
        state["port"] = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ready.set()
        await state["stop"].wait()
        await server.stop(None)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(30)
    try:
        yield servicer, f"127.0.0.1:{state['port']}"
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(30)
        assert not thread.is_alive()


FAST = tandem.RetryPolicy(max_attempts=4, initial_backoff_s=0.01, max_backoff_s=0.05)


def test_unary_retries_unavailable_then_succeeds(flaky) -> None:
    servicer, target = flaky
    servicer.plan = {"ListModels": ["unavailable"], "Generate": ["unavailable"]}
    with tandem.Client(target, retry=FAST) as client:
        assert [m.id for m in client.models()] == ["flaky"]
        assert client.generate("x").text == "ab"
    assert servicer.calls == {"ListModels": 2, "Generate": 2}


def test_async_unary_retries_unavailable_then_succeeds(flaky) -> None:
    servicer, target = flaky
    servicer.plan = {"ListModels": ["unavailable", "unavailable"]}

    async def run() -> list[tandem.ModelInfo]:
        async with tandem.AsyncClient(target, retry=FAST) as client:
            return await client.models()

    assert [m.id for m in asyncio.run(run())] == ["flaky"]
    assert servicer.calls["ListModels"] == 3


def test_stream_retries_only_before_its_first_chunk(flaky) -> None:
    servicer, target = flaky
    servicer.plan = {"Generate": ["unavailable", "fail-after-first"]}
    with tandem.Client(target, retry=FAST) as client:
        stream = client.generate_stream("x")
        first = next(stream)  # attempt 1 failed before any chunk: retried
        assert first.text == "a"
        with pytest.raises(tandem.Unavailable, match="mid-stream"):
            next(stream)  # attempt 2 failed after a chunk: raised, never retried
    assert servicer.calls["Generate"] == 2


def test_async_stream_retries_only_before_its_first_chunk(flaky) -> None:
    servicer, target = flaky
    servicer.plan = {"Generate": ["unavailable", "fail-after-first"]}

    async def run() -> list[str]:
        texts: list[str] = []
        async with tandem.AsyncClient(target, retry=FAST) as client:
            with pytest.raises(tandem.Unavailable):
                async for chunk in client.generate_stream("x"):
                    texts.append(chunk.text)
        return texts

    assert asyncio.run(run()) == ["a"]
    assert servicer.calls["Generate"] == 2


def test_overloaded_retried_only_with_retry_info(flaky) -> None:
    servicer, target = flaky
    servicer.plan = {"ListModels": ["busy-retry", "busy"]}
    with tandem.Client(target, retry=FAST) as client:
        start = time.monotonic()
        with pytest.raises(tandem.Overloaded) as err:
            client.models()  # 1: busy with retry-after 50 ms -> retried; 2: busy, no info
        assert time.monotonic() - start >= 0.05
        assert err.value.retry_after_s is None
        assert servicer.calls["ListModels"] == 2
        assert [m.id for m in client.models()] == ["flaky"]


def test_a_named_request_sends_its_id_as_metadata_on_every_attempt(flaky) -> None:
    """The caller's id travels as ``x-request-id`` metadata (what a proxy in between sees) as
    well as in the request, on retries too, next to the API key; no id, no metadata."""
    servicer, target = flaky
    servicer.plan = {"Generate": ["unavailable"]}
    with tandem.Client(target, retry=FAST, api_key="k") as client:
        assert client.generate("x", request_id="job-7/a").text == "ab"
        assert "".join(c.text for c in client.generate_stream("x", request_id="job-7/b")) == "ab"
        client.generate("x")

    async def run() -> None:
        async with tandem.AsyncClient(target, retry=FAST) as client:
            await client.generate("x", request_id="job-7/c")
            [c async for c in client.generate_stream("x", request_id="job-7/d")]

    asyncio.run(run())
    sent = [(m.get("x-request-id"), m.get("authorization")) for m in servicer.generate_metadata]
    assert sent == [("job-7/a", "Bearer k"), ("job-7/a", "Bearer k"),  # attempt 1 failed
                    ("job-7/b", "Bearer k"), (None, "Bearer k"),
                    ("job-7/c", None), ("job-7/d", None)]


def test_unauthenticated_is_auth_error_and_not_retried(flaky) -> None:
    servicer, target = flaky
    servicer.plan = {"ListModels": ["unauthenticated"]}
    with tandem.Client(target, retry=FAST, api_key="k") as client:
        with pytest.raises(tandem.AuthError):
            client.models()
    assert servicer.calls["ListModels"] == 1


def test_retries_stop_at_the_deadline(flaky) -> None:
    """A call that keeps failing ends at its deadline, not after its 1000 attempts (~100 s of
    backoff). It ends with the last attempt's Unavailable, or with DeadlineExceeded when the
    deadline ran out during that attempt (jittered backoff and the machine's load decide
    which; the exact rule is tests/unit/tandem/test_retry.py's, on a fake clock)."""
    servicer, target = flaky
    servicer.plan = {"ListModels": ["unavailable"] * 1000}
    slow = tandem.RetryPolicy(max_attempts=1000, initial_backoff_s=0.2, max_backoff_s=0.2)
    with tandem.Client(target, retry=slow, timeout_s=2.0) as client:
        start = time.monotonic()
        with pytest.raises((tandem.Unavailable, tandem.DeadlineExceeded)):
            client.models()
        assert time.monotonic() - start < 30.0  # a hang bound: far below 1000 backoffs
    assert 2 <= servicer.calls["ListModels"] < 1000
