"""Server-sent events of the OpenAI API: chat and completion chunks (``data:`` lines ending
in ``[DONE]``), ``n`` choices interleaved, and the Responses API's named events.

Each writer is handed the first message already computed: the route awaits it before the
headers go out, so a refusal is still a proper HTTP status; after the headers an error
travels as an event.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from aiohttp import web

from tandem.common.obs import tracing
from tandem.router.api.response import ResponseChunk
from tandem.router.errors import RouterError
from tandem.router.frontend import Frontend
from tandem.router.http import fanout
from tandem.router.http.errors import http_error
from tandem.router.http.openai_request import ApiRequest
from tandem.router.http.openai_response import ResponseShaper
from tandem.router.http.responses_shape import ResponsesShaper


async def stream(
    request: web.Request,
    api: ApiRequest,
    shaper: ResponseShaper,
    first: ResponseChunk,
    rest: AsyncIterator[ResponseChunk],
) -> web.StreamResponse:
    """Server-sent events: one ``data:`` per message, the usage event, then ``[DONE]``."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    last = first
    try:
        await _event(response, shaper.chunk(first, api.include_usage))
        async for message in rest:
            last = message
            await _event(response, shaper.chunk(message, api.include_usage))
        if api.include_usage:
            await _event(response, shaper.usage_chunk(last))
    except RouterError as err:  # headers are gone: the error travels as an event
        await _event(response, http_error(err).body)
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def stream_choices(
    request: web.Request, api: ApiRequest, shaper: ResponseShaper, frontend: Frontend,
    budget: float | None, parent: tracing.Parent,
) -> web.StreamResponse:
    """Server-sent events of ``n`` choices, interleaved as they come (``index`` tells them
    apart); the first message before the headers, so a refusal is still a proper status."""
    events = fanout.stream_all(frontend, api, budget, parent)
    async with aclosing(events):
        first = await anext(events)
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        lasts: dict[int, ResponseChunk] = {}
        try:
            i, message = first
            while True:
                lasts[i] = message
                await _event(response, shaper.chunk(message, api.include_usage, i))
                try:
                    i, message = await anext(events)
                except StopAsyncIteration:
                    break
            if api.include_usage:
                await _event(response, shaper.usage_chunk(*(lasts[k] for k in sorted(lasts))))
        except RouterError as err:  # headers are gone: the error travels as an event
            await _event(response, http_error(err).body)
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def stream_responses(
    request: web.Request, shaper: ResponsesShaper, first: ResponseChunk,
    rest: AsyncIterator[ResponseChunk],
) -> web.StreamResponse:
    """The Responses API's server-sent events (``event:`` named, no ``[DONE]``)."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    last = first
    try:
        for event in [*shaper.start(), *shaper.events(first)]:
            await _named_event(response, event)
        async for message in rest:
            last = message
            for event in shaper.events(message):
                await _named_event(response, event)
        for event in shaper.finish(last):
            await _named_event(response, event)
    except RouterError as err:  # headers are gone: the error travels as an event
        await _named_event(response, shaper.error(http_error(err).body))
    await response.write_eof()
    return response


async def _named_event(response: web.StreamResponse, body: dict[str, Any]) -> None:
    await response.write(f"event: {body['type']}\n".encode() + b"data: "
                         + json.dumps(body, separators=(",", ":")).encode() + b"\n\n")


async def _event(response: web.StreamResponse, body: dict[str, Any]) -> None:
    await response.write(b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n")
