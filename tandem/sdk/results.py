"""Typed results of the SDK: plain dataclasses built from the router's proto messages, so
callers never handle protobuf objects."""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.protos.v1 import tandem_pb2


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one request; ``cached_tokens`` came from a prefix cache."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def from_proto(cls, msg: tandem_pb2.Usage) -> Usage:
        return cls(msg.prompt_tokens, msg.completion_tokens, msg.cached_tokens)


@dataclass(frozen=True, slots=True)
class Timings:
    """Seconds in each phase as the router saw them: admission queue, prefill (compute + KV
    push), the KV push alone, arrival to first token (TTFT), first to last token, total."""

    queue_s: float = 0.0
    prefill_s: float = 0.0
    transfer_s: float = 0.0
    first_token_s: float = 0.0
    decode_s: float = 0.0
    total_s: float = 0.0

    @classmethod
    def from_proto(cls, msg: tandem_pb2.Timings) -> Timings:
        return cls(
            msg.queue_s, msg.prefill_s, msg.transfer_s, msg.first_token_s, msg.decode_s,
            msg.total_s,
        )


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A sampled token's logprob and the top alternatives (``(token_id, logprob)`` pairs)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()

    @classmethod
    def from_proto(cls, msg: tandem_pb2.TokenLogprob) -> TokenLogprob:
        return cls(msg.token_id, msg.logprob, tuple((t.token_id, t.logprob) for t in msg.top))


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A function call the model made: ``arguments`` is a JSON object's text."""

    id: str
    name: str
    arguments: str

    @classmethod
    def from_proto(cls, msg: tandem_pb2.ToolCall) -> ToolCall:
        return cls(msg.id, msg.name, msg.arguments)


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """One streamed message: new tokens and their text. The last chunk has ``finished`` set
    and carries the finish reason (stop | length | abort | tool_calls), usage, timings and
    the tool calls parsed from the output; the first carries the prompt logprobs when asked.
    Every chunk carries ``request_id`` (as ``GenerateResult``'s)."""

    request_id: str
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    finished: bool = False
    finish_reason: str = ""
    stop_reason: str = ""
    usage: Usage | None = None
    timings: Timings | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    prompt_logprobs: tuple[TokenLogprob, ...] = ()  # the first's logprob is NaN

    @classmethod
    def from_proto(cls, msg: tandem_pb2.GenerateResponse) -> StreamChunk:
        return cls(
            request_id=msg.request_id,
            token_ids=tuple(msg.token_ids),
            text=msg.text,
            logprobs=tuple(TokenLogprob.from_proto(lp) for lp in msg.logprobs),
            finished=msg.finished,
            finish_reason=msg.finish_reason,
            stop_reason=msg.stop_reason,
            usage=Usage.from_proto(msg.usage) if msg.finished else None,
            timings=Timings.from_proto(msg.timings) if msg.finished else None,
            tool_calls=tuple(ToolCall.from_proto(c) for c in msg.tool_calls),
            prompt_logprobs=tuple(TokenLogprob.from_proto(lp) for lp in msg.prompt_logprobs),
        )


@dataclass(frozen=True, slots=True)
class GenerateResult:
    """A whole generation: the text, its token ids, why it ended, usage and timings.
    ``request_id`` is the router's echo: the caller's own id when it gave one, else the id
    the router minted, which its log lines carry."""

    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    stop_reason: str = ""
    usage: Usage = field(default_factory=Usage)
    timings: Timings = field(default_factory=Timings)
    logprobs: tuple[TokenLogprob, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    prompt_logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """A served model: its id, context length and owner."""

    id: str
    max_model_len: int
    owned_by: str = ""


class ResultBuilder:
    """Accumulates stream chunks into a ``GenerateResult`` (what ``generate`` returns)."""

    __slots__ = ("_request_id", "_text", "_ids", "_logprobs", "_last", "_prompt_logprobs")

    def __init__(self) -> None:
        self._request_id = ""
        self._text: list[str] = []
        self._ids: list[int] = []
        self._logprobs: list[TokenLogprob] = []
        self._last: StreamChunk | None = None
        self._prompt_logprobs: tuple[TokenLogprob, ...] = ()

    def add(self, chunk: StreamChunk) -> None:
        self._request_id = self._request_id or chunk.request_id
        self._text.append(chunk.text)
        self._ids.extend(chunk.token_ids)
        self._logprobs.extend(chunk.logprobs)
        self._prompt_logprobs = self._prompt_logprobs or chunk.prompt_logprobs
        self._last = chunk

    @property
    def finished(self) -> bool:
        return self._last is not None and self._last.finished

    def result(self) -> GenerateResult:
        """The result so far; ``finish_reason`` is empty until the last chunk arrived."""
        last = self._last
        return GenerateResult(
            request_id=self._request_id,
            text="".join(self._text),
            token_ids=tuple(self._ids),
            finish_reason=last.finish_reason if last is not None else "",
            stop_reason=last.stop_reason if last is not None else "",
            usage=(last.usage if last is not None and last.usage is not None else Usage()),
            timings=(last.timings if last is not None and last.timings is not None else Timings()),
            logprobs=tuple(self._logprobs),
            tool_calls=last.tool_calls if last is not None else (),
            prompt_logprobs=self._prompt_logprobs,
        )
