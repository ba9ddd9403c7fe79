"""The public ``tandem.v1.Tandem`` service: a thin grpc.aio wrapper over Frontend.

Protobufs stop here: each request becomes the router's plain type as it arrives, and each
answer a message as it leaves (tandem/router/convert/public.py).

Request ids: a client may name its request in ``GenerateRequest.request_id`` or in the
``x-request-id`` metadata (the field wins); either is checked (tandem/router/validation.py
``check_request_label``) and is a label only. The call's initial metadata says
``x-request-id``: the client's id, or the router's when it sent none. A ``traceparent`` in
the metadata makes the request's trace a continuation of the client's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import replace

import grpc

from tandem.common.obs import tracing
from tandem.common.wire import REQUEST_ID_KEY
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc
from tandem.router.api.request import GenerateRequest
from tandem.router.client_limits import key_of
from tandem.router.convert import public as wire
from tandem.router.errors import InvalidRequestError, RouterError
from tandem.router.frontend import Frontend
from tandem.router.handoff.counters import HandoffCounters
from tandem.router.status import abort_with
from tandem.router.validation import check_request_label


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
        named: str | None = None  # the id sent in the initial metadata, once sent
        try:
            with self._frontend.client_slot(context.peer(), _key(context)) as slot:
                metadata = _metadata(context)
                plain = self._generate_request(request, metadata)
                accepted = self._frontend.accept(plain, trace_parent=tracing.extract(metadata))
                self._frontend.charge(slot, self._frontend.cost_of(accepted))
                await context.send_initial_metadata(((REQUEST_ID_KEY, accepted.label),))
                named = accepted.label
                async with aclosing(
                    self._frontend.generate(accepted, context.time_remaining())
                ) as responses:
                    async for response in responses:
                        yield wire.response_to_proto(response)
        except RouterError as err:
            await abort_with(context, err, request_id=named)

    async def Tokenize(  # noqa: N802
        self, request: tandem_pb2.TokenizeRequest, context: grpc.aio.ServicerContext
    ) -> tandem_pb2.TokenizeResponse:
        """Token ids of a text or chat input."""
        try:
            with self._frontend.client_slot(context.peer(), _key(context)) as slot:
                self._check_caps(request)
                plain = wire.tokenize_request_from_proto(request)
                self._frontend.charge(slot, self._frontend.tokenize_cost(plain))
                ids = await self._frontend.tokenize(plain)
                return wire.tokenize_response_to_proto(ids)
        except RouterError as err:
            await abort_with(context, err)

    def _generate_request(self, request: tandem_pb2.GenerateRequest,
                          metadata: dict[str, str]) -> GenerateRequest:
        """The plain request of a Generate call: its caps checked on the message, then built,
        its id from the ``x-request-id`` metadata when the message names none. A refusal
        (InvalidRequestError) is counted as an invalid request, as the HTTP edge counts a
        body it refuses and ``Frontend.accept`` its own refusals."""
        try:
            self._check_caps(request)
            plain = wire.generate_request_from_proto(request)
            label = metadata.get(REQUEST_ID_KEY)
            if label is not None and not plain.request_id:
                check_request_label(label, REQUEST_ID_KEY)
                plain = replace(plain, request_id=label)
        except InvalidRequestError:
            self._frontend.metrics.finished("invalid")
            raise
        return plain

    def _check_caps(self, request: tandem_pb2.GenerateRequest | tandem_pb2.TokenizeRequest
                    ) -> None:
        """The request caps (tandem/router/request_caps.py) on the message's repeated fields,
        before the plain request is built from them."""
        caps = self._frontend.deps.config.request_caps
        which = request.WhichOneof("prompt" if isinstance(request, tandem_pb2.GenerateRequest)
                                   else "input")
        if which == "token_ids":
            caps.check_token_ids(len(request.token_ids.ids), "token_ids")
        elif which == "chat":
            caps.check_messages(len(request.chat.messages), "chat.messages")

    async def ListModels(  # noqa: N802
        self, request: tandem_pb2.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> tandem_pb2.ListModelsResponse:
        """The served model."""
        return wire.models_to_proto(self._frontend.list_models())


def _metadata(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """The call's text metadata as a dict (binary ``-bin`` values left out)."""
    return {name: value for name, value in context.invocation_metadata() or ()
            if isinstance(value, str)}


def _key(context: grpc.aio.ServicerContext) -> str | None:
    """The identity of the API key the call presented (None without one)."""
    for name, value in context.invocation_metadata() or ():
        if name == "authorization" and isinstance(value, str):
            return key_of(value)
    return None
