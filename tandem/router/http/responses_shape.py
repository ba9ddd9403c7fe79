"""A generation's ``ResponseChunk`` messages -> OpenAI Responses API objects and stream events
(the shapes of the ``openai`` package's ``openai.types.responses``).

One state machine over the messages makes both the whole response and the stream, so they
always agree. Output items open as the output reaches them and close when the next begins:

    reasoning      {"type": "reasoning", "content": [{"type": "reasoning_text"}]}
                   (a reasoning parser's thinking)
    message        {"type": "message", "content": [{"type": "output_text"}]}  (the answer's
                   text; whitespace alone before a call or the end makes no message)
    function_call  {"type": "function_call", "call_id", "name", "arguments"}  (one per call)

    stream: response.created, response.in_progress, then per item
            response.output_item.added, [response.content_part.added],
            response.{reasoning_text | output_text | function_call_arguments}.delta ...,
            ....done, [response.content_part.done], response.output_item.done,
            and last response.completed (response.incomplete when max_output_tokens cut it:
            incomplete_details.reason "max_output_tokens"); an error after the headers is an
            ``error`` event. Every event carries its ``sequence_number``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tandem.router.api.response import ResponseChunk, Usage
from tandem.router.http.responses_request import ResponsesRequest
from tandem.router.tools.call import CallDelta

Event = dict[str, Any]


@dataclass(slots=True)
class _Item:
    """The output item being written: its kind, place, id and text (or arguments) so far."""

    kind: str  # reasoning | message | function_call
    index: int
    id: str
    text: str = ""
    call_id: str = ""
    name: str = ""
    call_index: int = -1


@dataclass(slots=True)
class _Tokens:
    """Output tokens, and those spent before the answer began (the thinking's)."""

    before_answer: int = 0
    answered: bool = False
    thought: bool = False


class ResponsesShaper:
    """Shapes one Responses request's answer; ``reasoning``: a reasoning parser's thinking
    comes back as reasoning items."""

    def __init__(self, request: ResponsesRequest, model: str, request_id: str,
                 reasoning: bool) -> None:
        self._request = request
        self._model = model
        self._id = request_id
        self._reasoning = reasoning and request.api.include_reasoning
        self._created = int(time.time())
        self._sequence = 0
        self._items: list[dict[str, Any]] = []  # closed output items
        self._open: _Item | None = None
        self._calls = 0
        self._pending = ""  # whitespace the answer began with: a message only if text follows
        self._tokens = _Tokens()

    # -- the whole response --------------------------------------------------------------

    def whole(self, chunks: Sequence[ResponseChunk]) -> dict[str, Any]:
        """The non-streaming response for all of a generation's messages."""
        for chunk in chunks:
            self.events(chunk)
        return self.finish(chunks[-1])[-1]["response"]

    # -- the stream ----------------------------------------------------------------------

    def start(self) -> list[Event]:
        """The stream's first events: the response created, in progress."""
        body = self._response("in_progress", None)
        return [self._event("response.created", response=body),
                self._event("response.in_progress", response=body)]

    def events(self, chunk: ResponseChunk) -> list[Event]:
        """The events one message settles."""
        out: list[Event] = []
        if chunk.reasoning and self._reasoning:
            out += self._reasoning_delta(chunk.reasoning)
            self._tokens.thought = True
        if chunk.text:
            out += self._text_delta(chunk.text)
        for delta in chunk.tool_call_deltas:
            out += self._call_delta(delta)
        if not self._tokens.answered:
            self._tokens.answered = bool(chunk.text.strip() or chunk.tool_call_deltas)
            if not self._tokens.answered:
                self._tokens.before_answer += len(chunk.token_ids)
        return out

    def finish(self, last: ResponseChunk) -> list[Event]:
        """The events closing the answer after its last message: the open item's, then
        response.completed (or response.incomplete), whose ``response`` is the whole one."""
        out = self._close()
        if not self._items:  # an answer of whitespace, or none, is still one message
            out += self._open_message()
            if self._pending:
                out += self._text_delta(self._pending)
            out += self._close()
        cut = last.finish_reason == "length"
        body = self._response("incomplete" if cut else "completed", last.usage or Usage())
        return [*out, self._event("response.incomplete" if cut else "response.completed",
                                  response=body)]

    def error(self, body: dict[str, Any]) -> Event:
        """An ``error`` event for an OpenAI error body (``{"error": {...}}``) after the
        headers went out."""
        error = body.get("error", {})
        return self._event("error", code=error.get("code"), message=error.get("message", ""),
                           param=error.get("param"))

    # -- items ---------------------------------------------------------------------------

    def _reasoning_delta(self, text: str) -> list[Event]:
        out: list[Event] = []
        if self._open is None or self._open.kind != "reasoning":
            out += self._close()
            item = self._begin("reasoning", f"rs_{self._id}_{len(self._items)}")
            out.append(self._added(item, {"id": item.id, "type": "reasoning", "summary": [],
                                          "content": [], "status": "in_progress"}))
            out.append(self._part("response.content_part.added", item, ""))
        assert self._open is not None
        self._open.text += text
        out.append(self._event("response.reasoning_text.delta", item_id=self._open.id,
                               output_index=self._open.index, content_index=0, delta=text))
        return out

    def _text_delta(self, text: str) -> list[Event]:
        out: list[Event] = []
        if self._open is None or self._open.kind != "message":
            if not (self._pending + text).strip():
                self._pending += text
                return []
            out += self._close() + self._open_message()
            text, self._pending = self._pending + text, ""
        assert self._open is not None
        self._open.text += text
        out.append(self._event("response.output_text.delta", item_id=self._open.id,
                               output_index=self._open.index, content_index=0, delta=text,
                               logprobs=[]))
        return out

    def _open_message(self) -> list[Event]:
        item = self._begin("message", f"msg_{self._id}_{len(self._items)}")
        return [self._added(item, {"id": item.id, "type": "message", "role": "assistant",
                                   "status": "in_progress", "content": []}),
                self._part("response.content_part.added", item, "")]

    def _call_delta(self, delta: CallDelta) -> list[Event]:
        out: list[Event] = []
        if self._open is None or self._open.call_index != delta.index:
            self._pending = ""  # whitespace before a call is no message
            out += self._close()
            item = self._begin("function_call", f"fc_{self._id}_{self._calls}")
            self._calls += 1
            item.call_id, item.name, item.call_index = delta.id, delta.name, delta.index
            out.append(self._added(item, self._call_item(item, "in_progress")))
        assert self._open is not None
        if delta.arguments:
            self._open.text += delta.arguments
            out.append(self._event("response.function_call_arguments.delta",
                                   item_id=self._open.id, output_index=self._open.index,
                                   delta=delta.arguments))
        return out

    def _begin(self, kind: str, item_id: str) -> _Item:
        self._open = _Item(kind, len(self._items), item_id)
        return self._open

    def _close(self) -> list[Event]:
        """The events that finish the open item (none open: none)."""
        item, self._open = self._open, None
        if item is None:
            return []
        if item.kind == "function_call":
            done = self._call_item(item, "completed")
            out = [self._event("response.function_call_arguments.done", item_id=item.id,
                               output_index=item.index, name=item.name, arguments=item.text)]
        else:
            reasoning = item.kind == "reasoning"
            part = _part(item.kind, item.text)
            if reasoning:
                done = {"id": item.id, "type": "reasoning", "summary": [], "content": [part],
                        "status": "completed"}
                out = [self._event("response.reasoning_text.done", item_id=item.id,
                                   output_index=item.index, content_index=0, text=item.text)]
            else:
                done = {"id": item.id, "type": "message", "role": "assistant",
                        "status": "completed", "content": [part]}
                out = [self._event("response.output_text.done", item_id=item.id,
                                   output_index=item.index, content_index=0, text=item.text,
                                   logprobs=[])]
            out.append(self._part("response.content_part.done", item, item.text))
        self._items.append(done)
        out.append(self._event("response.output_item.done", output_index=item.index,
                               item=done))
        return out

    def _call_item(self, item: _Item, status: str) -> dict[str, Any]:
        return {"id": item.id, "type": "function_call", "call_id": item.call_id,
                "name": item.name, "arguments": item.text, "status": status}

    def _added(self, item: _Item, shape: dict[str, Any]) -> Event:
        return self._event("response.output_item.added", output_index=item.index, item=shape)

    def _part(self, kind: str, item: _Item, text: str) -> Event:
        return self._event(kind, item_id=item.id, output_index=item.index, content_index=0,
                           part=_part(item.kind, text))

    # -- envelopes -----------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _response(self, status: str, usage: Usage | None) -> dict[str, Any]:
        r = self._request
        body: dict[str, Any] = {
            "id": f"resp_{self._id}", "object": "response", "created_at": self._created,
            "status": status, "model": self._model, "output": list(self._items),
            "error": None, "incomplete_details": None, "instructions": r.instructions,
            "metadata": r.metadata, "max_output_tokens": r.max_output_tokens,
            "parallel_tool_calls": r.parallel_tool_calls, "previous_response_id": None,
            "reasoning": None, "store": False, "temperature": r.temperature,
            "text": {"format": r.text_format}, "tool_choice": r.tool_choice, "tools": r.tools,
            "top_p": r.top_p, "truncation": "disabled", "user": r.user, "usage": None,
        }
        if status == "incomplete":
            body["incomplete_details"] = {"reason": "max_output_tokens"}
        if usage is not None:
            thinking = self._tokens.before_answer if self._tokens.thought else 0
            body["usage"] = {
                "input_tokens": usage.prompt_tokens,
                "input_tokens_details": {"cached_tokens": usage.cached_tokens},
                "output_tokens": usage.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": min(thinking,
                                                                  usage.completion_tokens)},
                "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            }
        return body


def _part(kind: str, text: str) -> dict[str, Any]:
    if kind == "reasoning":
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
