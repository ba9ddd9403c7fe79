"""``GenerateResponse`` messages -> OpenAI response objects (whole, or SSE chunks).

    completions   {"object": "text_completion", choices: [{text, logprobs, finish_reason}]}
    chat          {"object": "chat.completion", choices: [{message, logprobs, finish_reason}]}
    chat stream   {"object": "chat.completion.chunk", choices: [{delta, ...}]}  (role first)

Logprobs take each API's own shape: completions' parallel lists (``tokens``,
``token_logprobs``, ``top_logprobs`` as {token: logprob}, ``text_offset``), chat's
``content`` list of {token, logprob, bytes, top_logprobs}.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from protos.tandem.v1 import tandem_pb2
from router.http.openai_request import ApiRequest, Endpoint

TokenText = Callable[[int], str]


class ResponseShaper:
    """Shapes one request's responses; keeps the little state streaming needs."""

    def __init__(self, api: ApiRequest, model: str, request_id: str, token_text: TokenText) -> None:
        self._chat = api.endpoint is Endpoint.CHAT
        self._model = model
        self._id = ("chatcmpl-" if self._chat else "cmpl-") + request_id
        self._created = int(time.time())
        self._token_text = token_text
        self._offset = 0  # completions' text_offset runs across chunks
        self._sent_role = False

    def whole(self, responses: Sequence[tandem_pb2.GenerateResponse]) -> dict[str, Any]:
        """The non-streaming response for all of a request's messages."""
        text = "".join(r.text for r in responses)
        logprobs = [lp for r in responses for lp in r.logprobs]
        last = responses[-1]
        choice: dict[str, Any] = {
            "index": 0,
            "logprobs": self._logprobs(logprobs) if logprobs else None,
            "finish_reason": finish_reason(last.finish_reason),
        }
        if self._chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        body = self._envelope("chat.completion" if self._chat else "text_completion")
        body["choices"] = [choice]
        body["usage"] = usage(last.usage)
        return body

    def chunk(self, response: tandem_pb2.GenerateResponse, with_usage: bool) -> dict[str, Any]:
        """One SSE event for one message (``usage: null`` when the client asked for usage)."""
        choice: dict[str, Any] = {
            "index": 0,
            "logprobs": self._logprobs(response.logprobs) if response.logprobs else None,
            "finish_reason": finish_reason(response.finish_reason) if response.finished else None,
        }
        if self._chat:
            delta: dict[str, Any] = {"content": response.text}
            if not self._sent_role:
                delta = {"role": "assistant", **delta}
                self._sent_role = True
            choice["delta"] = delta
        else:
            choice["text"] = response.text
        body = self._envelope("chat.completion.chunk" if self._chat else "text_completion")
        body["choices"] = [choice]
        if with_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, last: tandem_pb2.GenerateResponse) -> dict[str, Any]:
        """The extra last event of ``stream_options.include_usage``: no choices, the usage."""
        body = self._envelope("chat.completion.chunk" if self._chat else "text_completion")
        body["choices"] = []
        body["usage"] = usage(last.usage)
        return body

    def _envelope(self, kind: str) -> dict[str, Any]:
        return {"id": self._id, "object": kind, "created": self._created, "model": self._model}

    def _logprobs(self, logprobs: Sequence[tandem_pb2.TokenLogprob]) -> dict[str, Any]:
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
        return {
            "tokens": tokens,
            "token_logprobs": [lp.logprob for lp in logprobs],
            "top_logprobs": [{text(t.token_id): t.logprob for t in lp.top} for lp in logprobs],
            "text_offset": offsets,
        }


def _chat_entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


def usage(u: tandem_pb2.Usage) -> dict[str, Any]:
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


def model_list(models: tandem_pb2.ListModelsResponse) -> dict[str, Any]:
    """``GET /v1/models``."""
    return {
        "object": "list",
        "data": [
            {"id": m.id, "object": "model", "created": 0, "owned_by": m.owned_by,
             "max_model_len": m.max_model_len, "weights_format": m.weights_format}
            for m in models.models
        ],
    }
