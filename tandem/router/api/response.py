"""What the router answers: a generation's messages, as they stream, and the model list.

A generation is a stream of ResponseChunks: each carries new tokens and their text; the
last of a sequence is ``finished`` and carries its usage and timings (and, when the request
had tools, the calls parsed from its output).
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.router.tools.call import CallDelta, ToolCall


@dataclass(frozen=True, slots=True)
class TopLogprob:
    """One alternative to a sampled token."""

    token_id: int
    logprob: float


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A token's logprob and its top alternatives (a prompt's first token: NaN)."""

    token_id: int
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one sequence (``cached_tokens``: prompt tokens a prefix cache held)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Timings:
    """Seconds spent in each phase of a request, as the router saw them."""

    queue_s: float = 0.0  # admission queue
    prefill_s: float = 0.0  # prefill call (compute + KV push)
    transfer_s: float = 0.0  # KV push as the prefill worker reported it
    first_token_s: float = 0.0  # arrival -> first token sent (TTFT)
    decode_s: float = 0.0  # first token -> last token
    total_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ResponseChunk:
    """One message of a generation's stream.

    ``request_id`` is the client's label for the request; ``index`` the sequence of a forked
    request (n / best_of) it belongs to. ``prompt_logprobs`` come on a sequence's first
    message only; ``usage``, ``timings`` and ``tool_calls`` on its last (``finished``) one;
    ``tool_call_deltas`` are the calls' pieces as the output settles them. ``reasoning``: the
    thinking this message settles (a request with ``separate_reasoning`` under a reasoning
    parser; ``text`` is then the answer only).
    """

    request_id: str
    token_ids: tuple[int, ...] = ()
    text: str = ""
    logprobs: tuple[TokenLogprob, ...] = ()
    finished: bool = False
    finish_reason: str = ""  # stop | length | abort | tool_calls (last message only)
    stop_reason: str = ""  # the stop string or token id that matched
    usage: Usage | None = None
    timings: Timings | None = None
    prompt_logprobs: tuple[TokenLogprob, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    index: int = 0
    tool_call_deltas: tuple[CallDelta, ...] = ()
    reasoning: str = ""


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """A served model: its context length and how its workers hold the weights."""

    id: str
    max_model_len: int
    owned_by: str = "tandem"
    weights_format: str = ""  # the workers' formats, distinct ones joined with "; "
    parent: str = ""  # a LoRA adapter's base model ("": a base model)
    root: str = ""  # a LoRA adapter's identity (name@digest of its bytes)
