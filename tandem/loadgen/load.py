"""Drive a Tandem endpoint with a list of timed requests and record what each one saw.

Four ways in, measured the same way (send -> first token -> every token -> last):

    run_load(target, specs)        the public ``Tandem.Generate`` stream on a router
    run_conversations(target, cs)  the same stream, multi-turn: each turn's prompt carries
                                   the reply the server gave the turn before
    run_direct(decode, prefill)    the worker RPCs the router itself makes (Reserve,
                                   Prefill or PrefillLocal, Decode): the no-router baseline
    run_openai(base_url, specs)    streaming ``/v1/completions`` on any OpenAI-compatible
                                   HTTP server (Tandem's router, llama-server, vLLM)

The first three speak gRPC through ``protos`` only, so they measure any Tandem endpoint; the
last speaks HTTP (aiohttp), so one client measures Tandem and another server alike.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Sequence

import aiohttp
import grpc

from tandem.common.security.credential import ClusterCredential
from tandem.common.security.grpc_auth import aio_interceptors
from tandem.loadgen.multiturn import KIND, Conversation, next_prompt
from tandem.loadgen.stats import RequestResult
from tandem.loadgen.workload import RequestSpec
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc, worker_pb2, worker_pb2_grpc

Progress = Callable[[RequestResult], None]


def greedy(max_tokens: int) -> tandem_pb2.SamplingParams:
    """Greedy sampling of exactly ``max_tokens`` tokens (EOS ignored: lengths are the mix's)."""
    return tandem_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def _metadata(api_key: str | None) -> tuple[tuple[str, str], ...] | None:
    return (("authorization", f"Bearer {api_key}"),) if api_key else None


async def _one(
    stub: tandem_pb2_grpc.TandemStub,
    spec: RequestSpec,
    t0: float,
    model: str,
    api_key: str | None,
    timeout_s: float,
    reply: list[int] | None = None,
) -> RequestResult:
    """One ``Generate`` call, timed; the generated ids are appended to ``reply`` when given."""
    result = RequestResult(spec.index, spec.kind, ok=False, prompt_tokens=len(spec.prompt_ids))
    request = tandem_pb2.GenerateRequest(
        model=model,
        token_ids=tandem_pb2.TokenIds(ids=spec.prompt_ids),
        sampling=greedy(spec.max_tokens),
    )
    sent = time.perf_counter()
    result.sent_at = sent - t0
    try:
        call = stub.Generate(request, timeout=timeout_s, metadata=_metadata(api_key))
        async for msg in call:
            now = time.perf_counter() - sent
            result.token_times += [now] * len(msg.token_ids)
            if reply is not None:
                reply.extend(msg.token_ids)
            if msg.finished:
                result.cached_tokens = msg.usage.cached_tokens
                result.ok = msg.finish_reason in ("length", "stop")
                if not result.ok:
                    result.error = f"finish_reason={msg.finish_reason}"
    except grpc.aio.AioRpcError as err:
        result.error = f"{err.code().name}: {err.details()}"
        result.ok = False
    _finish(result)
    return result


def _finish(result: RequestResult) -> None:
    result.output_tokens = len(result.token_times)
    if result.token_times:
        result.ttft = result.token_times[0]
        result.e2e = result.token_times[-1]
    elif result.ok:
        result.ok, result.error = False, "no tokens"


async def _paced(
    specs: Sequence[RequestSpec],
    run_one: Callable[[RequestSpec, float], object],
    progress: Progress | None,
    max_concurrency: int | None = None,
) -> tuple[list[RequestResult], float]:
    """Send each spec at its arrival time (open loop), and with ``max_concurrency`` only once
    fewer than that many are in flight (vLLM's ``--max-concurrency``: with every arrival at 0,
    a closed loop of that many users); returns results and wall seconds."""
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError("max_concurrency must be >= 1")
    t0 = time.perf_counter()
    slots = asyncio.Semaphore(max_concurrency or len(specs) or 1)

    async def at_arrival(spec: RequestSpec) -> RequestResult:
        delay = spec.arrival_s - (time.perf_counter() - t0)
        if delay > 0:
            await asyncio.sleep(delay)  # the arrival process itself, not a wait on state
        async with slots:
            result = await run_one(spec, t0)  # type: ignore[misc]
        if progress is not None:
            progress(result)
        return result

    results = await asyncio.gather(*(at_arrival(s) for s in specs))
    return sorted(results, key=lambda r: r.index), time.perf_counter() - t0


async def run_load(
    target: str,
    specs: Sequence[RequestSpec],
    *,
    model: str = "",
    api_key: str | None = None,
    timeout_s: float = 600.0,
    progress: Progress | None = None,
    credentials: grpc.ChannelCredentials | None = None,
    max_concurrency: int | None = None,
) -> tuple[list[RequestResult], float]:
    """Open-loop load on a router's ``Generate`` (at most ``max_concurrency`` in flight when
    given); returns per-request results and wall time."""
    async with _channel(target, credentials) as channel:
        stub = tandem_pb2_grpc.TandemStub(channel)
        return await _paced(
            specs,
            lambda spec, t0: _one(stub, spec, t0, model, api_key, timeout_s),
            progress, max_concurrency,
        )


def _channel(target: str, credentials: grpc.ChannelCredentials | None) -> grpc.aio.Channel:
    if credentials is not None:
        return grpc.aio.secure_channel(target, credentials)
    return grpc.aio.insecure_channel(target)


async def run_openai(
    base_url: str,
    specs: Sequence[RequestSpec],
    *,
    model: str = "",
    api_key: str | None = None,
    timeout_s: float = 600.0,
    progress: Progress | None = None,
    max_concurrency: int | None = None,
) -> tuple[list[RequestResult], float]:
    """Open-loop load on ``base_url``'s streaming ``/v1/completions`` (prompts sent as token
    ids, greedy, ``ignore_eos``: every request runs to its ``max_tokens``; at most
    ``max_concurrency`` in flight when given); results + wall time.

    A token's time is its SSE chunk's arrival; the count is the server's ``usage`` when it
    sends one (a chunk may carry more than one token, or none while text is held back).
    """
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    connector = aiohttp.TCPConnector(limit=0)  # one connection per concurrent stream
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(base_url, connector=connector, timeout=timeout,
                                     headers=headers) as session:
        return await _paced(specs, lambda spec, t0: _openai_one(session, spec, t0, model),
                            progress, max_concurrency)


async def _openai_one(
    session: aiohttp.ClientSession, spec: RequestSpec, t0: float, model: str
) -> RequestResult:
    result = RequestResult(spec.index, spec.kind, ok=False, prompt_tokens=len(spec.prompt_ids))
    body: dict[str, object] = {
        "prompt": list(spec.prompt_ids), "max_tokens": spec.max_tokens, "temperature": 0.0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }
    if model:
        body["model"] = model
    usage: dict[str, int] = {}
    finish = ""
    stream_error: str | None = None
    sent = time.perf_counter()
    result.sent_at = sent - t0
    try:
        async with session.post("/v1/completions", json=body) as reply:
            if reply.status != 200:
                result.error = f"HTTP {reply.status}: {(await reply.text())[:300]}"
                _finish(result)
                return result
            async for raw in reply.content:  # SSE: "data: {json}" lines, then "data: [DONE]"
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:  # the server failed the stream after its headers
                    event = chunk["error"]
                    stream_error = str(event.get("message", event) if isinstance(event, dict)
                                       else event)
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or ():
                    if choice.get("text"):
                        result.token_times.append(time.perf_counter() - sent)
                    finish = choice.get("finish_reason") or finish
        result.ok = finish in ("length", "stop") and stream_error is None
        if not result.ok:
            result.error = (f"error event: {stream_error}" if stream_error is not None
                            else f"finish_reason={finish or 'none'}")
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as err:
        result.error = f"{type(err).__name__}: {err}"
    _finish(result)
    if result.ok and usage.get("completion_tokens"):
        result.output_tokens = int(usage["completion_tokens"])
    return result


async def run_conversations(
    target: str,
    conversations: Sequence[Conversation],
    *,
    model: str = "",
    api_key: str | None = None,
    timeout_s: float = 600.0,
    progress: Progress | None = None,
    credentials: grpc.ChannelCredentials | None = None,
) -> tuple[list[RequestResult], float]:
    """Multi-turn load on a router's ``Generate``: one result per turn, and wall time.

    Conversations start at their arrival times (open loop); within one, a turn is sent its
    think time after the previous reply finished, its prompt built by ``next_prompt`` from the
    ids the server returned. After a failed turn the rest of that conversation is not sent:
    those turns are recorded as failed (they count against SLO attainment).
    """
    async with _channel(target, credentials) as channel:
        stub = tandem_pb2_grpc.TandemStub(channel)
        t0 = time.perf_counter()

        def record(result: RequestResult, conv: Conversation, turn: int) -> RequestResult:
            result.conversation, result.turn = conv.index, turn
            if progress is not None:
                progress(result)
            return result

        async def converse(conv: Conversation) -> list[RequestResult]:
            delay = conv.arrival_s - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)  # the arrival process itself
            results: list[RequestResult] = []
            prompt = conv.first_prompt()
            reply: list[int] = []
            for k, turn in enumerate(conv.turns):
                if results and not results[-1].ok:
                    failed = RequestResult(turn.index, KIND, ok=False, error="earlier turn failed")
                    results.append(record(failed, conv, k))
                    continue
                if k:
                    await asyncio.sleep(turn.think_s)  # the user reading and typing
                    prompt = next_prompt(prompt, reply, turn.user_ids)
                    reply = []
                spec = RequestSpec(turn.index, time.perf_counter() - t0, KIND, prompt,
                                   turn.max_tokens)
                result = await _one(stub, spec, t0, model, api_key, timeout_s, reply)
                results.append(record(result, conv, k))
            return results

        per_conv = await asyncio.gather(*(converse(c) for c in conversations))
        results = sorted((r for rs in per_conv for r in rs), key=lambda r: r.index)
        return results, time.perf_counter() - t0


async def run_direct(
    decode: str,
    prefill: str | None,
    specs: Sequence[RequestSpec],
    *,
    timeout_s: float = 600.0,
    progress: Progress | None = None,
    credential: ClusterCredential | None = None,
) -> tuple[list[RequestResult], float]:
    """The same load through the workers' own RPCs, as the router would make them.

    Reserve on ``decode``; then Prefill on ``prefill`` (or PrefillLocal on the decode worker
    when ``prefill`` is None); the first token comes from that reply; the rest from Decode.
    ``credential``: the cluster's (the workers answer members only; None: insecure workers).
    """
    def tokens(target: str) -> list[grpc.aio.ClientInterceptor]:
        return aio_interceptors(credential, target) if credential is not None else []

    async with grpc.aio.insecure_channel(decode, interceptors=tokens(decode)) as dch:
        d_stub = worker_pb2_grpc.DecodeServiceStub(dch)
        p_channel = (grpc.aio.insecure_channel(prefill, interceptors=tokens(prefill))
                     if prefill else None)
        p_stub = worker_pb2_grpc.PrefillServiceStub(p_channel) if p_channel else None
        try:
            return await _paced(
                specs,
                lambda spec, t0: _direct_one(d_stub, p_stub, spec, t0, timeout_s),
                progress,
            )
        finally:
            if p_channel is not None:
                await p_channel.close()


async def _direct_one(
    d_stub: worker_pb2_grpc.DecodeServiceStub,
    p_stub: worker_pb2_grpc.PrefillServiceStub | None,
    spec: RequestSpec,
    t0: float,
    timeout_s: float,
) -> RequestResult:
    result = RequestResult(spec.index, spec.kind, ok=False, prompt_tokens=len(spec.prompt_ids))
    leg = f"bench-{uuid.uuid4().hex[:12]}"
    sampling = greedy(spec.max_tokens)
    sent = time.perf_counter()
    result.sent_at = sent - t0
    try:
        reservation = await d_stub.Reserve(
            worker_pb2.ReserveRequest(
                request_id=leg, token_ids=spec.prompt_ids, sampling=sampling, lease_s=timeout_s
            ),
            timeout=timeout_s,
        )
        if p_stub is None:
            first = await d_stub.PrefillLocal(
                worker_pb2.PrefillLocalRequest(request_id=leg), timeout=timeout_s
            )
        else:
            first = await p_stub.Prefill(
                worker_pb2.PrefillRequest(
                    request_id=leg,
                    token_ids=spec.prompt_ids,
                    sampling=sampling,
                    transfer_id=reservation.transfer_id,
                    block_ids=reservation.block_ids,
                    skip_tokens=reservation.skip_tokens,
                    kv_endpoint=reservation.kv_endpoint,
                    layout=reservation.layout,
                ),
                timeout=timeout_s,
            )
        result.token_times.append(time.perf_counter() - sent)
        result.cached_tokens = first.cached_tokens
        async for msg in d_stub.Decode(worker_pb2.DecodeRequest(request_id=leg), timeout=timeout_s):
            now = time.perf_counter() - sent
            result.token_times += [now] * len(msg.token_ids)
            if msg.finished:
                result.ok = True
    except grpc.aio.AioRpcError as err:
        result.error = f"{err.code().name}: {err.details()}"
        await _abort(d_stub, leg)
    _finish(result)
    return result


async def _abort(d_stub: worker_pb2_grpc.DecodeServiceStub, leg: str) -> None:
    try:
        await d_stub.Abort(worker_pb2.AbortRequest(request_id=leg), timeout=5)
    except grpc.aio.AioRpcError:
        pass
