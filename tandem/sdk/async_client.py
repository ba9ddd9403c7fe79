"""``tandem.AsyncClient``: the asyncio twin of ``tandem.Client`` (same methods, awaited).

    async with tandem.AsyncClient("127.0.0.1:50051") as client:
        result = await client.generate("Once upon a time", max_tokens=32)
        async for chunk in client.generate_stream(prompt="Hi"):
            print(chunk.text, end="")

``aclose()`` on a stream, leaving its ``async with`` block, or dropping it after ``break``
cancels the RPC. Retry rules are ``tandem.Client``'s.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc
from tandem.sdk import request_builder
from tandem.sdk._channel import aio_channel, call_metadata, generate_metadata
from tandem.sdk.client_config import ClientConfig, call_timeout, resolve_config
from tandem.sdk.errors import Internal, from_rpc_error
from tandem.sdk.results import GenerateResult, ModelInfo, ResultBuilder, StreamChunk
from tandem.sdk.retry import Deadline, RetryPolicy, acall_with_retry
from tandem.sdk.sampling import SamplingOptions


class AsyncChunkStream:
    """The chunks of one streamed generation (an async iterator); ``aclose()`` cancels it."""

    def __init__(
        self,
        stub: tandem_pb2_grpc.TandemStub,
        request: tandem_pb2.GenerateRequest,
        metadata: tuple[tuple[str, str], ...],
        deadline: Deadline,
        retry: RetryPolicy,
        rng: random.Random,
    ) -> None:
        self._stub, self._request, self._metadata = stub, request, metadata
        self._deadline, self._retry, self._rng = deadline, retry, rng
        self._call: Any = None  # grpc.aio.UnaryStreamCall
        self._done = False
        self._builder = ResultBuilder()

    def __aiter__(self) -> AsyncChunkStream:
        return self

    async def __anext__(self) -> StreamChunk:
        if self._done:
            raise StopAsyncIteration
        try:
            msg = await (self._first() if self._call is None else self._call.read())
        except grpc.RpcError as err:
            self._done = True
            raise from_rpc_error(err) from err
        if msg is grpc.aio.EOF or msg is None:
            self._done = True
            raise StopAsyncIteration
        chunk = StreamChunk.from_proto(msg)
        self._builder.add(chunk)
        return chunk

    async def _first(self) -> Any:
        """Start the RPC and read its first message, retrying only until one arrives."""

        async def attempt(timeout: float | None) -> Any:
            call = self._stub.Generate(self._request, timeout=timeout, metadata=self._metadata)
            self._call = call
            return await call.read()

        try:
            return await acall_with_retry(attempt, self._retry, self._deadline, self._rng)
        except BaseException:
            self._done = True
            raise

    async def result(self) -> GenerateResult:
        """Read the rest of the stream and return the whole generation."""
        async for _ in self:
            pass
        if not self._builder.finished:
            raise Internal("the stream ended without its final message")
        return self._builder.result()

    def cancel(self) -> None:
        """Cancel the RPC if it is still running (idempotent; usable outside a coroutine)."""
        if self._call is not None and not self._done:
            self._call.cancel()
        self._done = True

    async def aclose(self) -> None:
        """Cancel the RPC if it is still running (idempotent)."""
        self.cancel()

    async def __aenter__(self) -> AsyncChunkStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel()

    def __del__(self) -> None:
        try:
            self.cancel()
        except Exception:  # noqa: BLE001 - loop already closed: nothing left to cancel
            pass


class AsyncClient:
    """An asyncio client of one router; see ``tandem.Client`` for the arguments. The channel
    is opened on first use, inside the running event loop."""

    def __init__(
        self, target: str | None = None, *, config: ClientConfig | None = None, **fields: Any
    ) -> None:
        self.config = resolve_config(target, config, fields)
        self._metadata = call_metadata(self.config)
        self._rng = random.Random()
        self._channel: grpc.aio.Channel | None = None
        self._stub: tandem_pb2_grpc.TandemStub | None = None
        self._health: health_pb2_grpc.HealthStub | None = None

    def _stubs(self) -> tuple[tandem_pb2_grpc.TandemStub, health_pb2_grpc.HealthStub]:
        if self._stub is None or self._health is None:
            self._channel = aio_channel(self.config)
            self._stub = tandem_pb2_grpc.TandemStub(self._channel)
            self._health = health_pb2_grpc.HealthStub(self._channel)
        return self._stub, self._health

    async def generate(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[dict[str, str]] | None = None,
        token_ids: Sequence[int] | None = None,
        sampling: SamplingOptions | None = None,
        timeout: float | None = None,
        **options: Any,
    ) -> GenerateResult:
        """See ``tandem.Client.generate``."""
        request = request_builder.generate_request(
            prompt, messages=messages, token_ids=token_ids, sampling=sampling, **options
        )
        metadata = generate_metadata(self._metadata, request.request_id)
        stub, _ = self._stubs()

        async def attempt(timeout_s: float | None) -> GenerateResult:
            builder = ResultBuilder()
            call = stub.Generate(request, timeout=timeout_s, metadata=metadata)
            try:
                async for msg in call:
                    builder.add(StreamChunk.from_proto(msg))
            finally:
                call.cancel()  # no-op after a clean end
            if not builder.finished:
                raise Internal("the stream ended without its final message")
            return builder.result()

        return await acall_with_retry(
            attempt, self.config.retry, self._deadline(timeout), self._rng
        )

    def generate_stream(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[dict[str, str]] | None = None,
        token_ids: Sequence[int] | None = None,
        sampling: SamplingOptions | None = None,
        timeout: float | None = None,
        **options: Any,
    ) -> AsyncChunkStream:
        """See ``tandem.Client.generate_stream``; iterate it with ``async for``."""
        request = request_builder.generate_request(
            prompt, messages=messages, token_ids=token_ids, sampling=sampling, **options
        )
        stub, _ = self._stubs()
        return AsyncChunkStream(
            stub, request, generate_metadata(self._metadata, request.request_id),
            self._deadline(timeout), self.config.retry, self._rng,
        )

    async def tokenize(
        self,
        text: str | None = None,
        *,
        messages: Sequence[dict[str, str]] | None = None,
        model: str = "",
        add_special_tokens: bool = True,
        timeout: float | None = None,
    ) -> list[int]:
        """See ``tandem.Client.tokenize``."""
        request = request_builder.tokenize_request(
            text, messages=messages, model=model, add_special_tokens=add_special_tokens
        )
        stub, _ = self._stubs()
        reply = await self._unary(stub.Tokenize, request, timeout)
        return list(reply.token_ids)

    async def models(self, timeout: float | None = None) -> list[ModelInfo]:
        """See ``tandem.Client.models``."""
        stub, _ = self._stubs()
        reply = await self._unary(stub.ListModels, tandem_pb2.ListModelsRequest(), timeout)
        return [ModelInfo(m.id, m.max_model_len, m.owned_by) for m in reply.models]

    async def health(self, service: str = "", timeout: float | None = None) -> bool:
        """See ``tandem.Client.health``."""
        _, health = self._stubs()
        reply = await self._unary(
            health.Check, health_pb2.HealthCheckRequest(service=service), timeout
        )
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    async def close(self) -> None:
        """Close the channel; calls still running are cancelled."""
        if self._channel is not None:
            await self._channel.close()
        self._channel = self._stub = self._health = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _deadline(self, timeout: float | None) -> Deadline:
        return Deadline.after(call_timeout(self.config, timeout), time.monotonic)

    async def _unary(self, method: Any, request: Any, timeout: float | None) -> Any:
        async def attempt(timeout_s: float | None) -> Any:
            return await method(request, timeout=timeout_s, metadata=self._metadata)

        return await acall_with_retry(
            attempt, self.config.retry, self._deadline(timeout), self._rng
        )
