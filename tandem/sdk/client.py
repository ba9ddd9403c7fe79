"""``tandem.Client``: the blocking Python client of a Tandem router.

    with tandem.Client("127.0.0.1:50051", api_key="...") as client:
        print(client.generate("Once upon a time", max_tokens=32).text)
        for chunk in client.generate_stream(messages=[{"role": "user", "content": "Hi"}]):
            print(chunk.text, end="", flush=True)

Failures surface as ``tandem.sdk.errors`` types; retries follow ``tandem.sdk.retry``. ``generate``
is a unary call to its caller (nothing is returned until the end), so it retries as one;
``generate_stream`` retries only before its first chunk. Breaking out of a stream, closing
it or leaving its ``with`` block cancels the RPC, and the router frees the workers' blocks.
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
from tandem.sdk._channel import call_metadata, generate_metadata, sync_channel
from tandem.sdk.client_config import ClientConfig, call_timeout, resolve_config
from tandem.sdk.errors import Internal, from_rpc_error
from tandem.sdk.results import GenerateResult, ModelInfo, ResultBuilder, StreamChunk
from tandem.sdk.retry import Deadline, RetryPolicy, call_with_retry
from tandem.sdk.sampling import SamplingOptions


class ChunkStream:
    """The chunks of one streamed generation (an iterator); ``close()`` cancels the RPC.

    Also a context manager, and closed when garbage-collected, so ``break`` in a ``for``
    loop over it cancels the request on the server.
    """

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
        self._call: Any = None  # the grpc call object (a stream iterator with cancel())
        self._done = False
        self._builder = ResultBuilder()

    def __iter__(self) -> ChunkStream:
        return self

    def __next__(self) -> StreamChunk:
        if self._done:
            raise StopIteration
        try:
            msg = self._first() if self._call is None else next(self._call, None)
        except grpc.RpcError as err:
            self._done = True
            raise from_rpc_error(err) from err
        if msg is None:
            self._done = True
            raise StopIteration
        chunk = StreamChunk.from_proto(msg)
        self._builder.add(chunk)
        return chunk

    def _first(self) -> tandem_pb2.GenerateResponse | None:
        """Start the RPC and read its first message, retrying only until one arrives."""

        def attempt(timeout: float | None) -> tandem_pb2.GenerateResponse | None:
            call = self._stub.Generate(self._request, timeout=timeout, metadata=self._metadata)
            self._call = call
            return next(call, None)

        try:
            return call_with_retry(attempt, self._retry, self._deadline, self._rng)
        except BaseException:
            self._done = True
            raise

    def result(self) -> GenerateResult:
        """Read the rest of the stream and return the whole generation."""
        for _ in self:
            pass
        if not self._builder.finished:
            raise Internal("the stream ended without its final message")
        return self._builder.result()

    def close(self) -> None:
        """Cancel the RPC if it is still running (idempotent)."""
        if self._call is not None and not self._done:
            self._call.cancel()
        self._done = True

    def __enter__(self) -> ChunkStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to cancel
            pass


class Client:
    """A blocking client of one router. ``Client(target, **fields)`` overrides fields of
    ``config`` (default ``ClientConfig()``), e.g. ``Client("h:50051", api_key="k")``."""

    def __init__(
        self, target: str | None = None, *, config: ClientConfig | None = None, **fields: Any
    ) -> None:
        self.config = resolve_config(target, config, fields)
        self._channel = sync_channel(self.config)
        self._stub = tandem_pb2_grpc.TandemStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._metadata = call_metadata(self.config)
        self._rng = random.Random()

    def generate(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[dict[str, str]] | None = None,
        token_ids: Sequence[int] | None = None,
        sampling: SamplingOptions | None = None,
        timeout: float | None = None,
        **options: Any,
    ) -> GenerateResult:
        """Generate a completion of ``prompt`` (raw text), ``messages`` (chat) or
        ``token_ids``. Sampling: ``sampling=SamplingOptions(...)`` (typed) and/or the same
        fields as keywords in ``options`` (max_tokens, temperature, top_p, top_k, seed, stop,
        ...; never one field both ways). ``options`` also takes ``model``, ``request_id``,
        ``logprobs``, ``top_logprobs``, ``add_generation_prompt``, ``tools``,
        ``tool_choice``.

        ``request_id``: a name of the caller's for this request (1-128 letters, digits and
        ``-_.:/+=@~``), sent in the request and as ``x-request-id`` metadata; the router logs
        it as ``client_request_id`` and echoes it as the result's ``request_id``. Without
        one the result's (and a failure's) ``request_id`` is the router's own id, the one
        its log lines carry."""
        request = request_builder.generate_request(
            prompt, messages=messages, token_ids=token_ids, sampling=sampling, **options
        )
        metadata = generate_metadata(self._metadata, request.request_id)

        def attempt(timeout_s: float | None) -> GenerateResult:
            builder = ResultBuilder()
            call = self._stub.Generate(request, timeout=timeout_s, metadata=metadata)
            try:
                for msg in call:
                    builder.add(StreamChunk.from_proto(msg))
            finally:
                call.cancel()  # no-op after a clean end; frees the call on an exception
            if not builder.finished:
                raise Internal("the stream ended without its final message")
            return builder.result()

        return call_with_retry(attempt, self.config.retry, self._deadline(timeout), self._rng)

    def generate_stream(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[dict[str, str]] | None = None,
        token_ids: Sequence[int] | None = None,
        sampling: SamplingOptions | None = None,
        timeout: float | None = None,
        **options: Any,
    ) -> ChunkStream:
        """Like ``generate`` but yields ``StreamChunk``s as tokens arrive."""
        request = request_builder.generate_request(
            prompt, messages=messages, token_ids=token_ids, sampling=sampling, **options
        )
        return ChunkStream(
            self._stub, request, generate_metadata(self._metadata, request.request_id),
            self._deadline(timeout), self.config.retry, self._rng,
        )

    def tokenize(
        self,
        text: str | None = None,
        *,
        messages: Sequence[dict[str, str]] | None = None,
        model: str = "",
        add_special_tokens: bool = True,
        timeout: float | None = None,
    ) -> list[int]:
        """Token ids of ``text`` or of chat ``messages`` rendered by the chat template."""
        request = request_builder.tokenize_request(
            text, messages=messages, model=model, add_special_tokens=add_special_tokens
        )
        reply = self._unary(self._stub.Tokenize, request, timeout)
        return list(reply.token_ids)

    def models(self, timeout: float | None = None) -> list[ModelInfo]:
        """The models the router serves."""
        reply = self._unary(self._stub.ListModels, tandem_pb2.ListModelsRequest(), timeout)
        return [ModelInfo(m.id, m.max_model_len, m.owned_by) for m in reply.models]

    def health(self, service: str = "", timeout: float | None = None) -> bool:
        """True when the router reports SERVING (grpc.health.v1); False while it drains."""
        reply = self._unary(
            self._health.Check, health_pb2.HealthCheckRequest(service=service), timeout
        )
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def close(self) -> None:
        """Close the channel; calls still running are cancelled."""
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _deadline(self, timeout: float | None) -> Deadline:
        return Deadline.after(call_timeout(self.config, timeout), time.monotonic)

    def _unary(self, method: Any, request: Any, timeout: float | None) -> Any:
        def attempt(timeout_s: float | None) -> Any:
            return method(request, timeout=timeout_s, metadata=self._metadata)

        return call_with_retry(attempt, self.config.retry, self._deadline(timeout), self._rng)
