"""The public ``tandem.v1.Tandem`` service: a thin grpc.aio wrapper over Frontend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

import grpc

from protos.tandem.v1 import tandem_pb2, tandem_pb2_grpc
from router.client_limits import key_of
from router.errors import RouterError
from router.frontend import Frontend
from router.handoff.counters import HandoffCounters
from router.status import abort_with


class TandemServicer(tandem_pb2_grpc.TandemServicer):
    """Maps RPCs to Frontend calls and typed errors to status codes; holds no logic.

    A call's client is its peer (one connection) and, when API keys are configured, the key
    in its ``authorization`` metadata. ``counters`` exposes the handoff's fallback and
    migration counts.
    """

    def __init__(self, frontend: Frontend) -> None:
        self._frontend = frontend
        self.counters: HandoffCounters = frontend.deps.counters

    async def Generate(  # noqa: N802 - gRPC method name
        self, request: tandem_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[tandem_pb2.GenerateResponse]:
        """Stream one request's tokens."""
        try:
            with self._frontend.client_slot(context.peer(), _key(context)):
                accepted = self._frontend.accept(request)
                async with aclosing(
                    self._frontend.generate(accepted, context.time_remaining())
                ) as responses:
                    async for response in responses:
                        yield response
        except RouterError as err:
            await abort_with(context, err)

    async def Tokenize(  # noqa: N802
        self, request: tandem_pb2.TokenizeRequest, context: grpc.aio.ServicerContext
    ) -> tandem_pb2.TokenizeResponse:
        """Token ids of a text or chat input."""
        try:
            with self._frontend.client_slot(context.peer(), _key(context)):
                return await self._frontend.tokenize(request)
        except RouterError as err:
            await abort_with(context, err)

    async def ListModels(  # noqa: N802
        self, request: tandem_pb2.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> tandem_pb2.ListModelsResponse:
        """The served model."""
        return self._frontend.list_models()


def _key(context: grpc.aio.ServicerContext) -> str | None:
    """The identity of the API key the call presented (None without one)."""
    for name, value in context.invocation_metadata() or ():
        if name == "authorization" and isinstance(value, str):
            return key_of(value)
    return None
