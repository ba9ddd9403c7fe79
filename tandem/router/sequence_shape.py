"""How one generated sequence's chunks become the client's messages.

    Chunk (token ids from the workers) -> text delta (detokenizer, stop strings)
        -> thinking | answer (a reasoning parser's, tandem/router/reasoning.py)
        -> tool calls read from the answer only (tandem/router/tool_use.py)
        -> ResponseChunk (the last one with the whole calls and the stop reason)

The frontend (tandem/router/frontend.py) keeps one ``Sequence`` per forked sequence of a
request and adds the accounting (usage, timings) to the last message.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tokenizers import Tokenizer

from tandem.common.text.detokenizer import Detokenizer
from tandem.router.api.response import ResponseChunk
from tandem.router.api.sampling import SamplingSpec
from tandem.router.reasoning import ReasoningStream
from tandem.router.reasoning_grammar import grammar_from_start
from tandem.router.request import Accepted, Chunk, Prepared
from tandem.router.text_stream import TextStream
from tandem.router.tool_use import ToolOutput
from tandem.router.tools.call import CallDelta


def skip_special_tokens(sampling: SamplingSpec) -> bool:
    """Whether the output text leaves special tokens out (it does unless the request says)."""
    return sampling.skip_special_tokens if sampling.skip_special_tokens is not None else True


def without_tokens(chunk: Chunk) -> Chunk:
    """A chunk of a prompt-scoring request (max_tokens 0), its generated token dropped."""
    return Chunk([], finished=chunk.finished, finish_reason="length" if chunk.finished else "",
                 prompt_logprobs=chunk.prompt_logprobs, index=chunk.index)


def with_calls(response: ResponseChunk, calls: ToolOutput) -> ResponseChunk:
    """The last message: the content and call pieces the tool parser still held, and the
    whole calls (then the finish reason is OpenAI's ``tool_calls``)."""
    rest, deltas, parsed = calls.finish()
    finish_reason = response.finish_reason
    if parsed and finish_reason == "stop":
        finish_reason = "tool_calls"
    return replace(response, text=response.text + rest,
                   tool_call_deltas=response.tool_call_deltas + tuple(deltas),
                   tool_calls=tuple(parsed), finish_reason=finish_reason)


def split_reasoning(reasoning: ReasoningStream, text: str, last: bool) -> tuple[str, str]:
    """(thinking, answer) of a text delta; the last one also gives what was held back."""
    thought, answer = reasoning.feed(text)
    if last:
        more_thought, more_answer = reasoning.finish()
        thought, answer = thought + more_thought, answer + more_answer
    return thought, answer


@dataclass(slots=True)
class Sequence:
    """How one sequence's chunks become messages: its text, its thinking apart from its
    answer (a reasoning parser's), its tool calls (read from the answer only), its counts."""

    text: TextStream
    calls: ToolOutput | None
    reasoning: ReasoningStream | None = None
    completion: int = 0
    last: float = 0.0  # its latest chunk with tokens (ITL is per sequence)
    done: bool = False

    @classmethod
    def open(cls, backend: Tokenizer, prepared: Prepared, accepted: Accepted,
             prompt_tail: str = "") -> Sequence:
        """A fresh sequence's text stream, reasoning splitter and tool-call parser."""
        sampling = prepared.sampling
        text = TextStream(
            Detokenizer(
                backend,
                prepared.prompt_ids,
                skip_special_tokens=skip_special_tokens(sampling),
                stop=sampling.stop,
                include_stop=sampling.include_stop_str_in_output,
                min_tokens=sampling.min_tokens or 0,
            )
        )
        calls = accepted.tools.output() if accepted.tools is not None else None
        reasoning = (accepted.reasoning.stream(prompt_tail, grammar_from_start(sampling))
                     if accepted.reasoning is not None else None)
        return cls(text, calls, reasoning)

    def shape(self, chunk: Chunk, request_id: str) -> ResponseChunk:
        """The message of one chunk (counted); the last one is marked done and carries the
        stop reason and the whole tool calls."""
        self.completion += len(chunk.token_ids)
        text = self.text.delta(chunk)
        thought = ""
        if self.reasoning is not None:
            thought, text = split_reasoning(self.reasoning, text, chunk.finished)
        call_deltas: list[CallDelta] = []
        if self.calls is not None:
            text, call_deltas = self.calls.feed(text)
        response = ResponseChunk(
            request_id=request_id,
            token_ids=tuple(chunk.token_ids),
            text=text,
            logprobs=tuple(chunk.logprobs),
            finished=chunk.finished,
            finish_reason=chunk.finish_reason,
            prompt_logprobs=tuple(chunk.prompt_logprobs),
            index=chunk.index,
            tool_call_deltas=tuple(call_deltas),
            reasoning=thought,
        )
        if chunk.finished:
            response = replace(response, stop_reason=(
                chunk.stop_reason or self.text.stop_reason or ""))
            if self.calls is not None:
                response = with_calls(response, self.calls)
            self.done = True
        return response
