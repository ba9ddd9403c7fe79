"""The OpenAI-compatible HTTP API, served by aiohttp inside the router's event loop.

    POST /v1/completions        POST /v1/chat/completions      (SSE when "stream": true)
    POST /v1/responses          (OpenAI's Responses API, stateless; run as the chat it amounts
                                 to: tandem/router/http/responses_request.py)
    GET  /v1/models             GET  /metrics (Prometheus)
    GET  /health, /ready (open: 200 when a request sent now is served, else 503 and why)
    GET  /livez (open: 200 while the process runs and its event loop answers)

``/health`` means what it means to vLLM's users, whose wait loops poll it before the first
request: the router can serve now (tandem/router/readiness.py); ``/ready`` is the same
handler under the name Kubernetes readiness probes use. ``/livez`` is the liveness probe's:
it stays 200 while the router drains or waits for workers (restarting it would not help).

With API keys every other route needs one; ``/metrics`` also takes a metrics key (a scraper's
credential that opens nothing else), and needs one of either when only metrics keys are set.

Requests go straight to ``Frontend`` (the same accept/generate the gRPC servicer calls) as
the router's plain types (tandem/router/api), built from the JSON body: no protobuf, no gRPC
hop and no second validator (the event streams: tandem/router/http/sse.py). A client that
disconnects cancels its handler (``handler_cancellation``), which closes the generation and
so both of its worker legs.

What a client may cost (RouterConfig): a body of at most ``max_request_bytes`` (413), sent
within ``http_read_timeout_s`` of the request's head (408), and the head itself within as
long of connecting or of the previous response (aiohttp's keep-alive timer closes a
connection whose next request is not complete by then: a slow-loris is cut); connections
open per client address (``max_connections_per_address``: a 429 before aiohttp sees the
connection, tandem/router/http/connection_cap.py); a request's cost in flight per connection
and per API key (429, like admission's: the client is charged its sequences and prompt
tokens once its body is parsed, tandem/router/client_limits.py). A body is held to the request
caps before the router's types are built from it (fan-out, messages, token ids, JSON
nesting: 400s naming the limit, tandem/router/http/body_limits.py), and a large one is
decoded and parsed off the event loop in a bounded pool (tandem/router/http/body_pool.py).
Every route that does work for a client (generation, ``/tokenize``, ``/detokenize``) holds
a share of its client's bounds and passes the admission gate.

Request ids: a client may name its request with an ``X-Request-Id`` header (checked:
tandem/router/validation.py ``check_request_label``, a 400 when it does not pass); every response
carries ``X-Request-Id``, the client's, or for a generation without one the router's id
(a fan-out of n choices gets one id for all). A ``traceparent`` header makes the request's
trace a continuation of the client's.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import uuid
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import replace
from typing import Any, TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from tandem.common.obs import tracing
from tandem.common.wire import REQUEST_ID_HEADER
from tandem.router.auth import ApiKeys
from tandem.router.client_limits import key_of
from tandem.router.errors import InvalidRequestError, OverloadedError, RouterError
from tandem.router.frontend import Frontend
from tandem.router.http import body_limits, fanout, lora_admin, sse
from tandem.router.http.body_pool import ParsePool
from tandem.router.http.connection_cap import AddressConnections, CappedSite
from tandem.router.http.errors import HttpError, HttpRefusal, error_body, http_error
from tandem.router.http.openai_request import ApiRequest, Endpoint, parse
from tandem.router.http.openai_response import ResponseShaper, model_list
from tandem.router.http.responses_request import parse_responses
from tandem.router.http.responses_shape import ResponsesShaper
from tandem.router.http.tokenize import detokenize_ids, tokenize_request
from tandem.router.readiness import Readiness
from tandem.router.request import Accepted
from tandem.router.request_caps import RequestCaps
from tandem.router.validation import check_request_label

log = logging.getLogger(__name__)
_T = TypeVar("_T")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
TIMEOUT_HEADER = "X-Tandem-Timeout"  # optional per-request budget in seconds (-> 504)
_OPEN_PATHS = frozenset({"/health", "/ready", "/livez"})
METRICS_PATH = "/metrics"
# Request storage: the X-Request-Id a response carries (a typed key where aiohttp has them).
_ECHO_ID: Any = (web.RequestKey("tandem_request_id", str) if hasattr(web, "RequestKey")
                 else "tandem_request_id")


class HttpServer:
    """The router's HTTP front door; ``start`` binds, ``stop`` closes it."""

    def __init__(
        self,
        frontend: Frontend,
        registry: CollectorRegistry,
        keys: ApiKeys | None = None,
        ssl_context: ssl.SSLContext | None = None,
        metrics_keys: ApiKeys | None = None,
        *,
        readiness: Readiness,
        admin_keys: ApiKeys | None = None,
    ) -> None:
        self._frontend = frontend
        self._registry = registry
        self._keys = keys
        self._metrics_keys = metrics_keys
        self._admin_keys = admin_keys
        self._ssl = ssl_context
        self._readiness = readiness
        config = frontend.deps.config
        self._max_body = config.max_request_bytes
        self._read_timeout_s = config.http_read_timeout_s
        self._caps = config.request_caps
        self._parse = ParsePool(config.http_parse_threads, config.http_parse_queue,
                                config.retry_after_ms)
        self._runner: web.AppRunner | None = None
        self.connections: AddressConnections | None = None  # open ones by address, once bound
        self.port = 0

    def app(self) -> web.Application:
        """The aiohttp application (routes and middlewares)."""
        app = web.Application(
            middlewares=[self._errors, self._request_id, self._auth],
            client_max_size=self._max_body,
        )
        app.on_response_prepare.append(_echo_request_id)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/detokenize", self._detokenize)
        app.router.add_get("/health", self._ready)
        app.router.add_get("/ready", self._ready)
        app.router.add_get("/livez", self._live)
        app.router.add_get(METRICS_PATH, self._metrics)
        if self._frontend.deps.config.allow_runtime_lora_updates:
            lora_admin.LoraAdmin(self._frontend).add_routes(app)
        return app

    async def start(self, host: str, port: int) -> int:
        """Bind ``host:port`` (0 picks a free port) and serve; returns the bound port."""
        # After a refusal with the body unread, aiohttp reads (and drops) what is still coming
        # for at most ``lingering_time`` so the client sees the answer: bounded here too.
        runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None,
                               keepalive_timeout=self._read_timeout_s,
                               lingering_time=min(10.0, self._read_timeout_s))
        await runner.setup()
        config = self._frontend.deps.config
        site = CappedSite(runner, host, port, config.max_connections_per_address,
                          config.retry_after_ms, ssl_context=self._ssl)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        self.connections = site.connections
        self.port = site.bound_port
        return self.port

    async def stop(self) -> None:
        """Close the listener and any open connections."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._parse.close()

    # -- middlewares ---------------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except RouterError as err:
            return _error_response(http_error(err))
        except HttpRefusal as refusal:
            response = _error_response(refusal.error)
            if refusal.close:
                response.force_close()
            return response
        except web.HTTPException as exc:  # unknown route, wrong method, body too large
            if exc.status < 400:
                raise
            body = error_body(exc.status, f"{exc.reason}: {request.method} {request.path}")
            return web.json_response(body, status=exc.status)

    @web.middleware
    async def _request_id(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        value = request.headers.get(REQUEST_ID_HEADER)
        if value is not None:
            check_request_label(value, REQUEST_ID_HEADER)  # a 400 (_errors) when it fails
            request[_ECHO_ID] = value
        return await handler(request)

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in _OPEN_PATHS and not self._allowed(request):
            body = error_body(401, "missing or invalid API key (Authorization: Bearer <key>)",
                              code="invalid_api_key")
            return web.json_response(body, status=401, headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    def _allowed(self, request: web.Request) -> bool:
        """Whether the request's credential opens its path (open paths aside)."""
        header = request.headers.get("Authorization")
        if request.path in lora_admin.PATHS:  # the admin key only, never open
            return self._admin_keys is not None and self._admin_keys.allows(header)
        guards = [self._keys]
        if request.path == METRICS_PATH:
            guards.append(self._metrics_keys)
        present = [g for g in guards if g is not None]
        return not present or any(g.allows(header) for g in present)

    # -- routes --------------------------------------------------------------------------

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, Endpoint.COMPLETIONS)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, Endpoint.CHAT)

    async def _models(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(model_list(self._frontend.list_models()))

    async def _tokenize(self, request: web.Request) -> web.StreamResponse:
        frontend = self._frontend
        with frontend.client_slot(_connection(request), self._key(request)) as slot:
            plain = await self._parsed(
                request, lambda text: tokenize_request(body_limits.decode(
                    text, lambda body: body_limits.check_tokenize(body, self._caps)), self._caps))
            frontend.charge(slot, frontend.tokenize_cost(plain))
            ids = await frontend.tokenize(plain)
        return web.json_response({"count": len(ids), "tokens": ids,
                                  "max_model_len": frontend.deps.config.max_model_len})

    async def _detokenize(self, request: web.Request) -> web.StreamResponse:
        frontend = self._frontend
        vocab = frontend.tokenizer.vocab_size
        with frontend.client_slot(_connection(request), self._key(request)) as slot:
            ids = await self._parsed(
                request, lambda text: detokenize_ids(body_limits.decode(
                    text, lambda body: body_limits.check_detokenize(body, self._caps)), vocab,
                    self._caps))
            frontend.charge(slot, frontend.detokenize_cost(ids))
            text = await frontend.detokenize(ids)
        return web.json_response({"prompt": text})

    async def _ready(self, request: web.Request) -> web.StreamResponse:
        reason = self._readiness.reason()
        if reason is not None:
            return web.json_response({"status": "unavailable", "reason": reason}, status=503)
        return web.json_response({"status": "ok"})

    async def _live(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"status": "alive"})

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        return web.Response(
            body=generate_latest(self._registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        """The Responses API: the chat request it amounts to, through the same admission,
        client bounds and caps as chat completions, answered in the Responses shapes."""
        with self._frontend.client_slot(_connection(request), self._key(request)) as slot:
            parsed = await self._counted(request, lambda text: parse_responses(
                body_limits.decode(text, lambda value: body_limits.check_responses(
                    value, self._caps))))
            api = parsed.api
            self._frontend.charge(slot, fanout.cost(api, self._frontend.deps.config.max_model_len))
            budget = _budget(request)
            accepted = self._accept_one(request, api)
            config = self._frontend.deps.config
            shaper = ResponsesShaper(parsed, api.request.model or config.model_name,
                                     accepted.label, reasoning=bool(config.reasoning_parser))
            responses = self._frontend.generate(accepted, budget)
            async with aclosing(responses):
                if not api.stream:
                    return web.json_response(shaper.whole([r async for r in responses]))
                first = await anext(responses)  # before the headers: a refusal keeps its status
                return await sse.stream_responses(request, shaper, first, responses)

    async def _counted(self, request: web.Request, build: Callable[[str], _T]) -> _T:
        """``build`` over the body (``_parsed``), a refusal counted as accept() counts its."""
        try:
            return await self._parsed(request, build)
        except (InvalidRequestError, HttpRefusal):
            self._frontend.metrics.finished("invalid")
            raise
        except OverloadedError:
            self._frontend.metrics.finished("overloaded")
            raise

    def _accept_one(self, request: web.Request, api: ApiRequest) -> Accepted:
        """Accept a one-sequence request under the client's label, which the response echoes."""
        accepted = self._frontend.accept(replace(api.request, request_id=request.get(
            _ECHO_ID, "")), trace_parent=tracing.extract(request.headers))
        request[_ECHO_ID] = accepted.label
        return accepted

    async def _generate(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        # Taken before the body is read: a refused client does not get to upload it first.
        with self._frontend.client_slot(_connection(request), self._key(request)) as slot:
            api = await self._counted(request, lambda text: _api_request(
                endpoint, text, self._caps))
            self._frontend.charge(slot, fanout.cost(api, self._frontend.deps.config.max_model_len))
            budget = _budget(request)
            parent = tracing.extract(request.headers)
            label = request.get(_ECHO_ID, "")
            if len(api.requests) > 1 or api.best_of > 1:
                label = request[_ECHO_ID] = label or uuid.uuid4().hex  # one id for the choices
                api.requests = [replace(r, request_id=label) for r in api.requests]
                if api.stream:
                    return await sse.stream_choices(request, api, self._shaper(api, label),
                                                 self._frontend, budget, parent)
                results = await fanout.run_all(self._frontend, api, budget, parent)
                return web.json_response(self._shaper(api, label).whole_batch(results))
            accepted = self._accept_one(request, api)
            shaper = self._shaper(api, accepted.label)
            responses = self._frontend.generate(accepted, budget)
            async with aclosing(responses):
                if not api.stream:
                    collected = [r async for r in responses]
                    return web.json_response(shaper.whole(collected))
                # The first message before the headers: a refusal is still a proper status.
                first = await anext(responses)
                return await sse.stream(request, api, shaper, first, responses)

    def _shaper(self, api: ApiRequest, label: str) -> ResponseShaper:
        config = self._frontend.deps.config
        # the model the client named (a LoRA adapter's name is echoed as vLLM does)
        return ResponseShaper(api, api.request.model or config.model_name, label,
                              self._token_text, self._decode,
                              reasoning=bool(config.reasoning_parser))

    def _key(self, request: web.Request) -> str | None:
        """The identity of the API key the request presented (None without keys)."""
        return key_of(request.headers.get("Authorization")) if self._keys is not None else None

    async def _parsed(self, request: web.Request, build: Callable[[str], _T]) -> _T:
        """``build`` over the request's body text: on the event loop for a small body, in
        the parse pool for a large one (429 when the pool is full)."""
        return await self._parse.run(build, await self._body_text(request))

    async def _body_text(self, request: web.Request) -> str:
        """The request's body, bounded in size and in the time it may take to arrive."""
        try:
            text = await asyncio.wait_for(request.text(), self._read_timeout_s)
        except web.HTTPRequestEntityTooLarge as exc:
            raise HttpRefusal(413, f"request body over {self._max_body} bytes",
                              "body", "request_too_large", close=True) from exc
        except asyncio.TimeoutError as exc:
            raise HttpRefusal(408, f"request body not received within {self._read_timeout_s:g} s",
                              "body", "request_timeout", close=True) from exc
        except UnicodeDecodeError as err:
            raise InvalidRequestError("body", f"not valid JSON: {err}") from err
        return text

    def _token_text(self, token_id: int) -> str:
        return self._frontend.tokenizer.decode([token_id], skip_special_tokens=False)

    def _decode(self, token_ids: list[int]) -> str:
        return self._frontend.tokenizer.decode(token_ids, skip_special_tokens=False)


async def _echo_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """Every response says the request's id (when it has one) before its headers go out."""
    value = request.get(_ECHO_ID)
    if value:
        response.headers[REQUEST_ID_HEADER] = value


def _api_request(endpoint: Endpoint, text: str, caps: RequestCaps) -> ApiRequest:
    """A body decoded, held to ``caps`` and parsed (in the parse pool for a large body)."""
    body = body_limits.decode(text, lambda value: body_limits.check_generation(
        endpoint, value, caps))
    return parse(endpoint, body)


def _connection(request: web.Request) -> str:
    """The client connection a request came on (its remote address and port)."""
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"http:{peer[0]}:{peer[1]}"
    return f"http:{request.remote}"


def _budget(request: web.Request) -> float | None:
    value = request.headers.get(TIMEOUT_HEADER)
    if value is None:
        return None
    try:
        budget = float(value)
    except ValueError:
        budget = -1.0
    if not budget > 0:
        raise InvalidRequestError(TIMEOUT_HEADER, "must be a positive number of seconds")
    return budget


def _error_response(err: HttpError) -> web.Response:
    return web.json_response(err.body, status=err.status, headers=err.headers)
