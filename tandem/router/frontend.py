"""What the public service does, without gRPC: accept, admit, tokenize, hand off, shape.

GenerateRequest -> validate (no tokenizer) -> Accepted -> admission -> tokenize -> Prepared
                -> Handoff chunks -> detokenize -> thinking | answer (a reasoning parser's,
                   tandem/router/reasoning.py) -> tool calls read from the answer
                -> ResponseChunk* (the last with usage)

It speaks the plain types of tandem/router/api: the gRPC servicer and the HTTP API convert
at their edges (tandem/router/convert; the HTTP API builds them from JSON).

A generation is one trace span (``request``, the child of the client's ``traceparent`` when
it sent one) with ``admission`` and ``tokenize`` below it and the handoff's spans
(tandem/router/handoff/ledger.py); every log line written meanwhile names the request
(tandem/common/obs/log_context.py): the router's id, and the client's own when it sent one.

A request accepted with ``n`` > 1 (the HTTP API's n / best_of) is one admitted request whose
prompt the workers compute once and fork into n sequences; each sequence is shaped on its
own (text, tool calls, usage on its last message) and its messages carry its ``index``.

What the metrics record of each request (its clock, TTFT, ITL, TPOT, outcome) is
tandem/router/request_accounting.py; how one sequence's chunks become its messages is
tandem/router/sequence_shape.py.

Only what costs nothing runs before admission; the tokenizer runs once the request holds a
slot, in a bounded thread pool (the Rust tokenizer releases the GIL), so a flood of huge
prompts queues or gets RESOURCE_EXHAUSTED instead of stalling the event loop for everyone.
A request is admitted by its cost (tandem/router/cost.py: sequences and prompt tokens), and
so is every call that does work for a client: Tokenize and detokenize pass the same gate.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing, asynccontextmanager, contextmanager
from dataclasses import replace
from typing import TypeVar

from tandem.common.obs import log_context, tracing
from tandem.common.wire import MAX_SEQUENCES
from tandem.placement.worker_view import Role
from tandem.router import adapters, validation
from tandem.router.admission import AdmissionGate
from tandem.router.api.chat import Chat
from tandem.router.api.request import GenerateRequest, TokenizeRequest
from tandem.router.api.response import ModelInfo, ResponseChunk
from tandem.router.client_limits import ClientLimits, Slot
from tandem.router.cost import NOTHING, Cost, prompt_tokens, request_cost
from tandem.router.errors import InvalidRequestError, OverloadedError
from tandem.router.generation_defaults import GenerationDefaults
from tandem.router.handoff.deadline import Deadline
from tandem.router.handoff.ledger import Handoff, HandoffDeps
from tandem.router.metrics import RouterMetrics
from tandem.router.reasoning import PARSERS as REASONING_PARSERS
from tandem.router.reasoning_grammar import defer_grammar
from tandem.router.request import Accepted, Prepared
from tandem.router.request_accounting import RequestAccounting, RequestClock
from tandem.router.sequence_shape import Sequence, without_tokens
from tandem.router.tokenizer import RouterTokenizer
from tandem.router.tool_use import ToolUse

_A = TypeVar("_A")
_TAIL_TOKENS = 32  # of the prompt, decoded to read where the output starts (thinking or not)
_T = TypeVar("_T")

log = logging.getLogger(__name__)


class Frontend:
    """The router's request path; the gRPC servicer is a thin wrapper over it.

    ``clients`` bounds each client's share (the edges name the client: its connection and
    API key, and charge its request's cost once they know it: ``charge``); without one, the
    config's per-connection bound applies and keys are not counted. ``close()`` stops the tokenizer threads.
    """

    def __init__(
        self,
        deps: HandoffDeps,
        tokenizer: RouterTokenizer,
        gate: AdmissionGate,
        metrics: RouterMetrics,
        clients: ClientLimits | None = None,
    ) -> None:
        self.deps = deps
        self.tokenizer = tokenizer
        self.generation_defaults = GenerationDefaults.load(deps.config.tokenizer_dir)
        self.gate = gate
        self.metrics = metrics
        self.accounting = RequestAccounting(metrics)
        config = deps.config
        self.clients = clients or ClientLimits(
            config.connection_budget, NOTHING, config.retry_after_ms
        )
        self.limits = validation.InputLimits(
            config.max_stop_strings, config.max_stop_chars, config.max_stop_token_ids,
            config.grammar_limits,
        )
        self._pool = ThreadPoolExecutor(
            max_workers=config.tokenizer_threads, thread_name_prefix="router-tokenize"
        )

    def close(self) -> None:
        """Stop the tokenizer threads (a tokenization still running finishes on its own)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    @contextmanager
    def client_slot(self, connection: str, key: str | None) -> Iterator[Slot]:
        """Hold a share of the client's bounds while the block runs: one sequence until
        ``charge`` raises it to the request's cost (a refusal is counted as an overloaded
        request, like admission's)."""
        try:
            slot = self.clients.enter(connection, key)
        except OverloadedError:
            self.metrics.finished("overloaded")
            raise
        try:
            yield slot
        finally:
            self.clients.leave(slot)

    def charge(self, slot: Slot, cost: Cost) -> None:
        """Charge the client the whole ``cost`` of its request (tandem/router/client_limits.py
        ``grow``); refusals are counted as accept's and admission's are."""
        try:
            self.clients.grow(slot, cost)
        except OverloadedError:
            self.metrics.finished("overloaded")
            raise
        except InvalidRequestError:
            self.metrics.finished("invalid")
            raise

    def cost_of(self, accepted: Accepted) -> Cost:
        """What an accepted request is admitted by: its sequences and its prompt's tokens."""
        return request_cost(accepted.request.prompt, accepted.n, self.deps.config.max_model_len)

    def accept(self, request: GenerateRequest, n: int = 1,
               trace_parent: tracing.Parent = None) -> Accepted:
        """Every check that needs no tokenizer, and the request's router-minted id; raises
        InvalidRequestError naming the bad field. ``n``: sequences to fork the prompt into
        (their messages carry an index). ``trace_parent``: the client's trace context
        (tandem/common/obs/tracing.py ``extract``), which the request's span continues."""
        try:
            if not 1 <= n <= MAX_SEQUENCES:
                raise InvalidRequestError("n", f"must be in [1, {MAX_SEQUENCES}], got {n}")
            accepted = self._accept(request, trace_parent)
        except InvalidRequestError:
            self.metrics.finished("invalid")
            raise
        accepted.n = n
        return accepted

    def _accept(self, request: GenerateRequest, trace_parent: tracing.Parent) -> Accepted:
        arrival = time.perf_counter()
        config = self.deps.config
        asked = request.sampling.max_tokens
        prompt = request.prompt
        if isinstance(prompt, tuple):  # by count first: a huge id list is refused before it is read
            validation.check_length(len(prompt), asked or 1, config.max_model_len)
        tools = None
        if isinstance(prompt, Chat):
            tools = ToolUse.from_chat(prompt, self.tokenizer.chat_template, config.tool_call_parser)
            if tools is not None:  # before validation checks the schema's size
                request = replace(request, sampling=tools.constrain(request.sampling))
        # a served LoRA adapter's name is a model too (its identity travels with the request)
        lora = adapters.resolve(self.deps.registry, request.model) \
            if request.model != config.model_name else ""
        validation.validate_request(
            request, request.model if lora else config.model_name, self.tokenizer.vocab_size,
            self.limits,
        )
        if isinstance(prompt, str):
            validation.check_prompt_chars(
                len(prompt), self.tokenizer.max_token_chars, asked, config.max_model_len
            )
        # The id every worker sees is ours; the client's is a label echoed back to it only.
        request_id = uuid.uuid4().hex
        if request.user:
            log.debug("request %s (client id %r) for user %r", request_id,
                      request.request_id, request.user)
        reasoning = None
        if request.separate_reasoning and isinstance(prompt, Chat) and config.reasoning_parser:
            reasoning = REASONING_PARSERS[config.reasoning_parser]
        return Accepted(request, request_id, request.request_id or request_id, arrival, tools,
                        trace_parent, reasoning=reasoning, lora=lora)

    async def _prepare(self, accepted: Accepted, span: tracing.Span) -> Prepared:
        """Tokenize an admitted request (in the pool) and settle its max_tokens."""
        request = accepted.request
        config = self.deps.config
        if isinstance(request.prompt, tuple):
            ids = list(request.prompt)
        else:
            with tracing.span("tokenize", span):
                ids = await self._in_pool(self._encode, request)
        if not ids:
            raise InvalidRequestError("prompt", "tokenizes to nothing")
        sampling = self.generation_defaults.apply(request.sampling)
        room = config.max_model_len - len(ids)
        if sampling.max_tokens is not None:
            max_tokens = sampling.max_tokens
        elif isinstance(request.prompt, Chat):  # a reply runs to its end (as vLLM)
            max_tokens = max(1, room)
        else:  # completions: OpenAI's default, clamped to the room the context leaves
            max_tokens = max(1, min(validation.DEFAULT_MAX_TOKENS, room))
        validation.check_length(len(ids), max_tokens, config.max_model_len)
        score_only = max_tokens == 0
        max_tokens = max(max_tokens, 1)
        sampling = replace(sampling, max_tokens=max_tokens)
        return Prepared(
            request_id=accepted.request_id,
            prompt_ids=ids,
            sampling=sampling,
            logprobs=request.logprobs,
            max_tokens=max_tokens,
            arrival=accepted.arrival,
            label=accepted.label,
            score_only=score_only,
            n=accepted.n,
            lora=accepted.lora,
        )

    def _encode(self, request: GenerateRequest) -> list[int]:
        """A text or chat prompt's ids (runs in a pool thread)."""
        prompt = request.prompt
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        assert isinstance(prompt, Chat)
        text = self.tokenizer.render_chat(prompt)
        # Only the rendered text is bounded by its length: a template may drop or trim parts.
        validation.check_prompt_chars(
            len(text), self.tokenizer.max_token_chars, request.sampling.max_tokens,
            self.deps.config.max_model_len,
        )
        return self.tokenizer.encode(text, add_special_tokens=False)

    async def _in_pool(self, fn: Callable[[_A], _T], arg: _A) -> _T:
        """``fn(arg)`` on a tokenizer thread; a cancelled caller stops waiting at once."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, arg)

    async def generate(
        self, accepted: Accepted, budget_s: float | None
    ) -> AsyncIterator[ResponseChunk]:
        """Admit the request, tokenize it, run its handoff and stream its responses."""
        arrived_ns = time.time_ns() - int((time.perf_counter() - accepted.arrival) * 1e9)
        with tracing.span("request", accepted.trace_parent, kind=tracing.SERVER,
                          start_ns=arrived_ns,
                          attributes={"tandem.request_id": accepted.request_id}) as span, \
                log_context.bound(accepted.request_id, accepted.label, tracing.ids(span)):
            async with aclosing(self._generate(accepted, budget_s, span)) as responses:
                async for response in responses:
                    yield response

    async def _generate(
        self, accepted: Accepted, budget_s: float | None, span: tracing.Span
    ) -> AsyncIterator[ResponseChunk]:
        clock = RequestClock(arrival=accepted.arrival, queued=time.perf_counter())
        deadline = Deadline(budget_s)
        counters = self.deps.counters
        counters.requests += 1
        metrics = self.metrics
        cost = self.cost_of(accepted)
        try:
            with tracing.span("admission", span):
                await self.gate.enter(cost)
        except BaseException as exc:
            self.accounting.failed(exc, deadline)
            raise
        try:
            clock.admitted = time.perf_counter()
            metrics.queue_time.observe(clock.admitted - clock.queued)
            prepared = await self._prepare(accepted, span)
            metrics.prompt_tokens.inc(len(prepared.prompt_ids))
            span.set_attribute("tandem.prompt_tokens", len(prepared.prompt_ids))
            tail = ""
            if accepted.reasoning is not None:  # a grammar then constrains the answer alone
                tail = self._prompt_tail(prepared)
                prepared.sampling = defer_grammar(accepted.reasoning, self.tokenizer.backend,
                                                  tail, prepared.sampling)
            handoff = Handoff(self.deps, prepared, deadline, span)
            sequences = [self._sequence(prepared, accepted, tail) for _ in range(prepared.n)]
            async with aclosing(handoff.stream()) as chunks:
                async for chunk in chunks:
                    if prepared.score_only:  # the one token the workers had to generate
                        chunk = without_tokens(chunk)
                    seq = sequences[chunk.index]
                    response = seq.shape(chunk, prepared.label or prepared.request_id)
                    seq.last = self.accounting.chunk(chunk.token_ids, clock, seq.last)
                    if chunk.finished:
                        last = all(s.done for s in sequences)
                        usage, timings = self.accounting.finish(
                            response.finish_reason, len(prepared.prompt_ids), handoff.report,
                            seq.completion, clock, last)
                        response = replace(response, usage=usage, timings=timings)
                        if last:
                            span.set_attribute("tandem.completion_tokens",
                                               sum(s.completion for s in sequences))
                            span.set_attribute("tandem.finish_reason", response.finish_reason)
                    yield response
            counters.completed += 1
        except (asyncio.CancelledError, GeneratorExit) as exc:
            counters.cancelled += 1
            if not clock.ended:
                self.accounting.failed(exc, deadline)
            raise
        except BaseException as exc:
            counters.failed += 1
            if not clock.ended:
                self.accounting.failed(exc, deadline)
            raise
        finally:
            self.gate.leave(cost)

    def _prompt_tail(self, prepared: Prepared) -> str:
        """The text of the prompt's last tokens: whether the template opened (or closed) the
        model's thinking shows there (tandem/router/reasoning.py)."""
        return self.tokenizer.decode(prepared.prompt_ids[-_TAIL_TOKENS:],
                                     skip_special_tokens=False)

    def _sequence(self, prepared: Prepared, accepted: Accepted, prompt_tail: str = ""
                  ) -> Sequence:
        """A fresh sequence's text stream, reasoning splitter and tool-call parser."""
        return Sequence.open(self.tokenizer.backend, prepared, accepted, prompt_tail)

    async def tokenize(self, request: TokenizeRequest) -> list[int]:
        """Token ids of a text or chat input, as Generate would see them (tokenized in the
        pool; a text too long to be any prompt is refused before that)."""
        if request.model and request.model != self.deps.config.model_name and \
                not adapters.resolve(self.deps.registry, request.model):  # an adapter's too
            raise InvalidRequestError("model", f"unknown model {request.model!r}")
        if request.chat is not None:
            validation.validate_chat(request.chat)
            async with self._admitted(self.tokenize_cost(request)):
                return await self._in_pool(self.tokenizer.encode_chat, request.chat)
        if request.text is not None:
            validation.check_prompt_chars(
                len(request.text), self.tokenizer.max_token_chars, None,
                self.deps.config.max_model_len, field="text",
            )
            async with self._admitted(self.tokenize_cost(request)):
                return await self._in_pool(self._encode_text, request)
        raise InvalidRequestError("input", "one of text or chat is required")

    async def detokenize(self, token_ids: list[int]) -> str:
        """The text of token ids (decoded in the tokenizer pool; special tokens kept)."""
        async with self._admitted(self.detokenize_cost(token_ids)):
            return await self._in_pool(self._decode, token_ids)

    def tokenize_cost(self, request: TokenizeRequest) -> Cost:
        """What a tokenize call is charged: one sequence and its input's tokens."""
        return Cost(1, prompt_tokens(request.chat if request.chat is not None
                                     else request.text, self.deps.config.max_model_len))

    def detokenize_cost(self, token_ids: list[int]) -> Cost:
        """What a detokenize call is charged: one sequence and its ids."""
        return Cost(1, min(len(token_ids), self.deps.config.max_model_len))

    @asynccontextmanager
    async def _admitted(self, cost: Cost) -> AsyncIterator[None]:
        """Hold ``cost`` of the admission gate while the block runs (work that is not a
        generation: tokenize, detokenize)."""
        await self.gate.enter(cost)
        try:
            yield
        finally:
            self.gate.leave(cost)

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)

    def _encode_text(self, request: TokenizeRequest) -> list[int]:
        assert request.text is not None
        return self.tokenizer.encode(request.text, add_special_tokens=request.add_special_tokens)

    def list_models(self) -> list[ModelInfo]:
        """The model this router serves, with how its routable workers hold the weights, and
        each LoRA adapter they serve (its ``parent`` the base model)."""
        config = self.deps.config
        formats = sorted({w.weights_format for role in (Role.PREFILL, Role.DECODE)
                          for w in self.deps.registry.routable(role) if w.weights_format})
        base = ModelInfo(id=config.model_name, max_model_len=config.max_model_len,
                         owned_by="tandem", weights_format="; ".join(formats))
        return [base, *(replace(base, id=name, parent=config.model_name, root=identity)
                        for name, identity in sorted(adapters.served(self.deps.registry).items()))]
