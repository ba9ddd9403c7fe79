"""A generation's ``ResponseChunk`` messages (tandem/router/api/response.py) -> OpenAI
response objects (whole, or SSE chunks).

    completions   {"object": "text_completion", choices: [{text, logprobs, finish_reason}]}
    chat          {"object": "chat.completion", choices: [{message, logprobs, finish_reason}]}
    chat stream   {"object": "chat.completion.chunk", choices: [{delta, ...}]}  (role first)
    tool calls    message.tool_calls / delta.tool_calls[i] as they stream (id, type and name
                  first, then the arguments in pieces), finish_reason "tool_calls"
    functions     the legacy shape, for a request that came with ``functions``:
                  message.function_call / delta.function_call, finish_reason "function_call"
    reasoning     under a reasoning parser: message.reasoning_content (null without thinking)
                  and the thinking's deltas as delta.reasoning_content, each also under
                  vLLM's newer name ``reasoning``; ``content`` is the answer alone

Logprobs take each API's own shape: completions' parallel lists (``tokens``,
``token_logprobs``, ``top_logprobs`` as {token: logprob}, ``text_offset``), chat's
``content`` list of {token, logprob, bytes, top_logprobs}.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from tandem.router.api.request import GenerateRequest
from tandem.router.api.response import ModelInfo, ResponseChunk, TokenLogprob, Usage
from tandem.router.http.openai_request import ApiRequest, Endpoint
from tandem.router.tools.call import CallDelta, ToolCall

TokenText = Callable[[int], str]
Decode = Callable[[list[int]], str]


class ResponseShaper:
    """Shapes one request's responses; keeps the little state streaming needs."""

    def __init__(self, api: ApiRequest, model: str, request_id: str, token_text: TokenText,
                 decode: Decode | None = None, reasoning: bool = False) -> None:
        self._api = api
        # whether chat answers carry their thinking apart (a reasoning parser, not dropped)
        self._reasoning = reasoning and api.include_reasoning
        self._decode = decode
        self._chat = api.endpoint is Endpoint.CHAT
        self._model = model
        self._id = ("chatcmpl-" if self._chat else "cmpl-") + request_id
        self._created = int(time.time())
        self._token_text = token_text
        self._offset = 0  # completions' text_offset runs across chunks (of one choice)
        self._offsets: dict[int, int] = {}  # per choice while streaming several
        self._started: set[int] = set()  # choices whose first chunk went out

    def whole(self, responses: Sequence[ResponseChunk]) -> dict[str, Any]:
        """The non-streaming response for all of a request's messages."""
        return self.whole_batch([responses])

    def whole_batch(
        self, batch: Sequence[Sequence[ResponseChunk]]
    ) -> dict[str, Any]:
        """The non-streaming response of a batch: one choice per prompt, in order."""
        choices = [self._choice(i, responses) for i, responses in enumerate(batch)]
        body = self._envelope("chat.completion" if self._chat else "text_completion")
        body["choices"] = choices
        body["usage"] = usage(_summed([_usage(responses[-1]) for responses in batch],
                                      self._api.n))
        return body

    def _choice(self, index: int, responses: Sequence[ResponseChunk]) -> dict[str, Any]:
        text = "".join(r.text for r in responses)
        logprobs = [lp for r in responses for lp in r.logprobs]
        prompt_lp = [lp for r in responses for lp in r.prompt_logprobs]
        last = responses[-1]
        self._offset = 0
        echo = self._api.echo
        if echo:
            text = self._prompt_text(self._api.requests[index // self._api.n]) + text
        shaped = None
        if echo and prompt_lp and self._api.request.logprobs.enabled:
            shaped = self._logprobs(prompt_lp + logprobs, first_has_none=True)
        elif logprobs:
            shaped = self._logprobs(logprobs)
        choice: dict[str, Any] = {
            "index": index,
            "logprobs": shaped,
            "finish_reason": self._finish_reason(last.finish_reason),
        }
        if prompt_lp and self._api.request.sampling.prompt_logprobs is not None:
            choice["prompt_logprobs"] = self._prompt_logprobs(prompt_lp)
        if self._chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if self._reasoning:
                thought = "".join(r.reasoning for r in responses) or None
                message.update(reasoning_content=thought, reasoning=thought)
                message["content"] = text or None
            if last.tool_calls:
                message["content"] = text or None
                if self._api.functions:  # one call at most (the request allowed no more)
                    call = last.tool_calls[0]
                    message["function_call"] = {"name": call.name, "arguments": call.arguments}
                else:
                    message["tool_calls"] = [_call(c) for c in last.tool_calls]
            choice["message"] = message
        else:
            choice["text"] = text
        return choice

    def _prompt_text(self, request: GenerateRequest) -> str:
        prompt = request.prompt
        if isinstance(prompt, str):
            return prompt
        ids = list(prompt) if isinstance(prompt, tuple) else []
        return self._decode(ids) if self._decode is not None else ""

    def _prompt_logprobs(self, entries: Sequence[TokenLogprob]) -> list[dict[str, Any] | None]:
        """vLLM's ``prompt_logprobs``: per prompt token {id: {logprob, decoded_token}} for it
        and its top alternatives (None for the first token)."""
        out: list[dict[str, Any] | None] = []
        for lp in entries:
            if math.isnan(lp.logprob):
                out.append(None)
                continue
            entry = {str(lp.token_id): {"logprob": lp.logprob,
                                        "decoded_token": self._token_text(lp.token_id)}}
            for t in lp.top:
                entry.setdefault(str(t.token_id), {"logprob": t.logprob,
                                                   "decoded_token": self._token_text(t.token_id)})
            out.append(entry)
        return out

    def chunk(self, response: ResponseChunk, with_usage: bool, index: int = 0) -> dict[str, Any]:
        """One SSE event for one message of choice ``index`` (``usage: null`` when the
        client asked for usage)."""
        first = index not in self._started
        self._started.add(index)
        self._offset = self._offsets.get(index, 0)
        choice: dict[str, Any] = {
            "index": index,
            "logprobs": self._logprobs(response.logprobs) if response.logprobs else None,
            "finish_reason": (self._finish_reason(response.finish_reason) if response.finished
                              else None),
        }
        if self._chat:
            delta: dict[str, Any] = {"content": response.text}
            if self._reasoning and response.reasoning:  # thinking; the answer once it has some
                delta = {"reasoning_content": response.reasoning, "reasoning": response.reasoning,
                         **({"content": response.text} if response.text else {})}
            if first:
                delta = {"role": "assistant", **delta}
            if response.tool_call_deltas:  # the calls' pieces (the whole calls are not resent)
                delta["content"] = response.text or None
                pieces = _merged(response.tool_call_deltas)
                if self._api.functions:
                    if pieces and pieces[0]["index"] == 0:
                        delta["function_call"] = pieces[0]["function"]
                else:
                    delta["tool_calls"] = pieces
            choice["delta"] = delta
        else:
            choice["text"] = response.text
            if self._api.echo and first:  # the prompt leads the first chunk
                choice["text"] = self._prompt_text(self._api.request) + response.text
        self._offsets[index] = self._offset
        body = self._envelope("chat.completion.chunk" if self._chat else "text_completion")
        body["choices"] = [choice]
        if with_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, *lasts: ResponseChunk) -> dict[str, Any]:
        """The extra last event of ``stream_options.include_usage``: no choices, the usage
        (summed over the choices' last messages)."""
        body = self._envelope("chat.completion.chunk" if self._chat else "text_completion")
        body["choices"] = []
        body["usage"] = usage(_summed([_usage(last) for last in lasts], self._api.n))
        return body

    def _finish_reason(self, reason: str) -> str:
        out = finish_reason(reason)
        return "function_call" if out == "tool_calls" and self._api.functions else out

    def _envelope(self, kind: str) -> dict[str, Any]:
        return {"id": self._id, "object": kind, "created": self._created, "model": self._model}

    def _logprobs(self, logprobs: Sequence[TokenLogprob],
                  first_has_none: bool = False) -> dict[str, Any]:
        """Each API's logprobs shape; ``first_has_none``: echo's first prompt token, which
        has no logprob (None, as OpenAI and vLLM send it)."""
        text = self._token_text
        if self._chat:
            return {"content": [
                {**_chat_entry(text(lp.token_id), lp.logprob),
                 "top_logprobs": [_chat_entry(text(t.token_id), t.logprob) for t in lp.top]}
                for lp in logprobs
            ]}
        tokens = [text(lp.token_id) for lp in logprobs]
        offsets = []
        for token in tokens:
            offsets.append(self._offset)
            self._offset += len(token)
        values: list[float | None] = [lp.logprob for lp in logprobs]
        tops: list[dict[str, float] | None] = [
            {text(t.token_id): t.logprob for t in lp.top} for lp in logprobs
        ]
        if first_has_none and logprobs and math.isnan(logprobs[0].logprob):
            values[0] = tops[0] = None
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
                "text_offset": offsets}


def _usage(last: ResponseChunk) -> Usage:
    """A choice's usage, from its last message (all zero if it carries none)."""
    return last.usage if last.usage is not None else Usage()


def _summed(usages: Sequence[Usage], n: int) -> Usage:
    """Several choices' usage as one: each prompt's tokens once (its first choice's figures,
    ``n`` choices per prompt, as OpenAI counts them), every choice's completion tokens."""
    firsts = usages[::n]
    return Usage(
        prompt_tokens=sum(u.prompt_tokens for u in firsts),
        completion_tokens=sum(u.completion_tokens for u in usages),
        cached_tokens=sum(u.cached_tokens for u in firsts),
    )


def _call(call: ToolCall) -> dict[str, Any]:
    """One OpenAI ``tool_calls`` item."""
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def _merged(deltas: Sequence[CallDelta]) -> list[dict[str, Any]]:
    """One message's call pieces as OpenAI ``delta.tool_calls`` items, one per call (a call's
    head and its first argument text may settle together)."""
    out: list[dict[str, Any]] = []
    for d in deltas:
        if not out or out[-1]["index"] != d.index:
            item: dict[str, Any] = {"index": d.index}
            if d.id:
                item.update(id=d.id, type="function")
            item["function"] = {"name": d.name} if d.name else {}
            item["function"]["arguments"] = ""
            out.append(item)
        out[-1]["function"]["arguments"] += d.arguments
    return out


def _chat_entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


def usage(u: Usage) -> dict[str, Any]:
    """OpenAI's usage object (cached prompt tokens under ``prompt_tokens_details``)."""
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


def finish_reason(reason: str) -> str:
    """The engine's finish reason as OpenAI names it (stop | length; others pass through)."""
    return reason or "stop"


def model_list(models: Sequence[ModelInfo]) -> dict[str, Any]:
    """``GET /v1/models``."""
    return {
        "object": "list",
        "data": [
            {"id": m.id, "object": "model", "created": 0, "owned_by": m.owned_by,
             "max_model_len": m.max_model_len, "weights_format": m.weights_format,
             "root": m.root or m.id, "parent": m.parent or None}
            for m in models
        ],
    }
