"""Checks on a GenerateRequest (tandem/router/api) before any worker sees it.

The sampling ranges match the engine's (tandem/engine/sampling_params.py), re-checked here
so a bad request never costs a worker round trip; the gRPC and HTTP APIs both build the
plain request first, so one set of checks serves both. Token-level checks (vocab,
context length) run once the prompt is tokenized; a text prompt whose length in characters
already proves it too long is refused before that (``check_prompt_chars``).

Everything here is cheap and needs no tokenizer, so it runs before admission: a request that
fails it costs its sender a refusal and nobody else anything.
"""

from __future__ import annotations

import math
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tandem.router.api.chat import Chat
from tandem.router.api.request import GenerateRequest
from tandem.router.api.sampling import SamplingSpec
from tandem.router.errors import InvalidRequestError
from tandem.router.grammar_limits import DEFAULT_GRAMMAR_LIMITS, GrammarLimits, check_grammar

CHAT_ROLES = frozenset({"system", "user", "assistant", "tool"})
MAX_TOOL_CALLS = 128  # per assistant message in the history
# The engine's defaults for the two fields the router needs to know (tandem/engine/sampling_params.py).
DEFAULT_MAX_TOKENS = 16
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 300  # OpenAI's limit on biased tokens
MAX_STRUCTURED_CHARS = 64 * 1024  # a schema, regex or grammar (the engine's limit too)
MAX_CHOICES = 256
MAX_USER_CHARS = 256  # the end-user label (logged only)
# A client's own request id (X-Request-Id, x-request-id, GenerateRequest.request_id): a label
# echoed back to it and written in the router's log lines, so short and of characters that
# need no escaping anywhere (UUIDs, hex, base64, "req-42", "svc/7:abc" all fit).
MAX_REQUEST_ID_CHARS = 128
REQUEST_ID_CHARS = frozenset(string.ascii_letters + string.digits + "-_.:/+=@~")


@dataclass(frozen=True, slots=True)
class InputLimits:
    """Bounds on what one request may ask of the router and the decode engine.

    Stop strings are searched in every detokenized chunk (router) and every step (engine), and
    the longest one sets how much text is held back: their cost grows with count x length, so
    both are bounded. 4 strings is what OpenAI's API allows; 256 characters is far above any
    real stop sequence (role tags, "\n\nUser:", code fences are tens of characters) while
    keeping the per-token search at most 4 x 256 characters. Stop token ids are a set lookup
    per step but travel with every leg: 64 is far above the handful of end-of-turn ids models
    have. ``grammar`` bounds a structured output's complexity (tandem/router/grammar_limits.py).
    """

    max_stop_strings: int = 4
    max_stop_chars: int = 256
    max_stop_token_ids: int = 64
    grammar: GrammarLimits = DEFAULT_GRAMMAR_LIMITS


DEFAULT_LIMITS = InputLimits()


def validate_request(
    request: GenerateRequest,
    model_name: str,
    vocab_size: int,
    limits: InputLimits = DEFAULT_LIMITS,
) -> None:
    """Raise InvalidRequestError naming the first bad field of ``request``."""
    if request.model and request.model != model_name:
        raise InvalidRequestError(
            "model", f"unknown model {request.model!r}; serving {model_name!r}"
        )
    prompt = request.prompt
    if prompt is None:
        raise InvalidRequestError("prompt", "one of text, token_ids or chat is required")
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequestError("prompt", "text is empty")
    elif isinstance(prompt, Chat):
        validate_chat(prompt)
    else:
        check_token_ids(prompt, vocab_size, "token_ids")
    validate_sampling(request.sampling, vocab_size, limits)
    if request.request_id:
        check_request_label(request.request_id, "request_id")
    if len(request.user) > MAX_USER_CHARS:
        raise InvalidRequestError("user", f"at most {MAX_USER_CHARS} characters")
    if request.logprobs.top_logprobs > MAX_TOP_LOGPROBS:
        raise InvalidRequestError("logprobs.top_logprobs", f"at most {MAX_TOP_LOGPROBS}")


def check_request_label(value: str, field: str) -> None:
    """A client's request id: 1..MAX_REQUEST_ID_CHARS characters of REQUEST_ID_CHARS; raises
    InvalidRequestError naming ``field`` (the value itself is never echoed: it may be hostile)."""
    if not value or len(value) > MAX_REQUEST_ID_CHARS:
        raise InvalidRequestError(field, f"must be 1..{MAX_REQUEST_ID_CHARS} characters")
    if not REQUEST_ID_CHARS.issuperset(value):
        raise InvalidRequestError(field, "may hold only letters, digits and - _ . : / + = @ ~")


def validate_chat(chat: Chat) -> None:
    """Every message needs a known role and content."""
    if not chat.messages:
        raise InvalidRequestError("chat", "no messages")
    for i, message in enumerate(chat.messages):
        if not message.role:
            raise InvalidRequestError(f"chat.messages[{i}].role", "missing")
        if message.role not in CHAT_ROLES:
            raise InvalidRequestError(
                f"chat.messages[{i}].role",
                f"unknown role {message.role!r}; expected one of {sorted(CHAT_ROLES)}",
            )
        if len(message.tool_calls) > MAX_TOOL_CALLS:
            raise InvalidRequestError(
                f"chat.messages[{i}].tool_calls", f"at most {MAX_TOOL_CALLS} calls"
            )
        if message.tool_calls and message.role != "assistant":
            raise InvalidRequestError(
                f"chat.messages[{i}].tool_calls", "only assistant messages make tool calls"
            )
        if not message.content and not message.tool_calls:  # a call may come without text
            raise InvalidRequestError(f"chat.messages[{i}].content", "missing")


def check_token_ids(
    ids: Iterable[int], vocab_size: int, field: str, allow_empty: bool = False
) -> None:
    """Token ids must be inside the vocabulary (and, for a prompt, not empty)."""
    ids = list(ids)
    if not ids and not allow_empty:
        raise InvalidRequestError(field, "empty prompt")
    for t in ids:
        if t >= vocab_size:
            raise InvalidRequestError(field, f"token id {t} >= vocab size {vocab_size}")


def validate_sampling(
    s: SamplingSpec, vocab_size: int, limits: InputLimits = DEFAULT_LIMITS
) -> None:
    """The engine's sampling ranges, applied to the fields the client set, and ``limits``."""
    max_tokens = s.max_tokens if s.max_tokens is not None else DEFAULT_MAX_TOKENS
    min_tokens = s.min_tokens if s.min_tokens is not None else 0
    scores_prompt = s.prompt_logprobs is not None
    if max_tokens < (0 if scores_prompt else 1):  # 0: score the prompt, generate nothing
        raise InvalidRequestError(
            "max_tokens", f"must be >= 1 (0 only with prompt logprobs), got {max_tokens}"
        )
    if min_tokens > max_tokens:
        raise InvalidRequestError("min_tokens", "must be <= max_tokens")
    if s.temperature is not None:
        _finite(s.temperature, "temperature")
        if s.temperature < 0:
            raise InvalidRequestError("temperature", f"must be >= 0, got {s.temperature}")
    if s.top_p is not None:
        _finite(s.top_p, "top_p")
        if not 0.0 < s.top_p <= 1.0:
            raise InvalidRequestError("top_p", f"must be in (0, 1], got {s.top_p}")
    if s.top_k is not None and s.top_k < -1:
        raise InvalidRequestError("top_k", f"must be >= -1, got {s.top_k}")
    if s.min_p is not None:
        _finite(s.min_p, "min_p")
        if not 0.0 <= s.min_p <= 1.0:
            raise InvalidRequestError("min_p", f"must be in [0, 1], got {s.min_p}")
    if s.repetition_penalty is not None:
        _finite(s.repetition_penalty, "repetition_penalty")
        if s.repetition_penalty <= 0:
            raise InvalidRequestError("repetition_penalty", "must be > 0")
    for name, value in (("presence_penalty", s.presence_penalty),
                        ("frequency_penalty", s.frequency_penalty)):
        if value is not None:
            _finite(value, name)
            if not -2.0 <= value <= 2.0:
                raise InvalidRequestError(name, f"must be in [-2, 2], got {value}")
    if s.seed is not None and s.seed >= 2**63:
        raise InvalidRequestError("seed", "must be < 2**63")
    if len(s.stop) > limits.max_stop_strings:
        raise InvalidRequestError(
            "stop", f"{len(s.stop)} stop strings; at most {limits.max_stop_strings} allowed"
        )
    for stop in s.stop:
        if not stop:
            raise InvalidRequestError("stop", "stop strings must be non-empty")
        if len(stop) > limits.max_stop_chars:
            raise InvalidRequestError(
                "stop",
                f"a stop string of {len(stop)} characters; at most {limits.max_stop_chars}",
            )
    if len(s.stop_token_ids) > limits.max_stop_token_ids:
        raise InvalidRequestError(
            "stop_token_ids",
            f"{len(s.stop_token_ids)} stop token ids; at most {limits.max_stop_token_ids}",
        )
    check_token_ids(s.stop_token_ids, vocab_size, "stop_token_ids", allow_empty=True)
    validate_logit_bias(s.logit_bias, vocab_size)
    if s.structured is not None:
        validate_structured(s, limits.grammar)
        after = s.structured.after_token
        if after is not None:
            check_token_ids([after], vocab_size, "structured_outputs.after_token")
    if s.prompt_logprobs is not None and s.prompt_logprobs > MAX_TOP_LOGPROBS:
        raise InvalidRequestError("prompt_logprobs", f"at most {MAX_TOP_LOGPROBS}")


def validate_logit_bias(bias: Mapping[int, float], vocab_size: int) -> None:
    """At most MAX_LOGIT_BIAS tokens, each in the vocabulary, biased by -100..100."""
    if len(bias) > MAX_LOGIT_BIAS:
        raise InvalidRequestError("logit_bias", f"{len(bias)} tokens; at most {MAX_LOGIT_BIAS}")
    for token, value in bias.items():
        if token >= vocab_size:
            raise InvalidRequestError("logit_bias", f"token id {token} >= vocab size {vocab_size}")
        _finite(value, "logit_bias")
        if not -100.0 <= value <= 100.0:
            raise InvalidRequestError("logit_bias", f"bias {value} is outside [-100, 100]")


def validate_structured(s: SamplingSpec, limits: GrammarLimits = DEFAULT_GRAMMAR_LIMITS) -> None:
    """Sizes and complexity of a structured output (compiling it is the worker's grammar
    engine's job, within its budget), and the settings a grammar cannot honour (its end is an
    EOS)."""
    so = s.structured
    if so is None:
        return
    kind = so.kind
    field = f"structured_outputs.{kind}"
    if kind == "choice":
        choices = so.value
        assert isinstance(choices, tuple)
        if not choices or len(choices) > MAX_CHOICES or not all(choices):
            raise InvalidRequestError(field, f"1 to {MAX_CHOICES} non-empty strings")
        if sum(len(c) for c in choices) > MAX_STRUCTURED_CHARS:
            raise InvalidRequestError(field, f"more than {MAX_STRUCTURED_CHARS} characters")
    elif isinstance(so.value, str) and len(so.value) > MAX_STRUCTURED_CHARS:
        raise InvalidRequestError(field, f"more than {MAX_STRUCTURED_CHARS} characters")
    check_grammar(so, limits)
    if s.ignore_eos:
        raise InvalidRequestError("ignore_eos", "cannot be combined with structured outputs")
    if s.min_tokens:
        raise InvalidRequestError("min_tokens", "cannot be combined with structured outputs")


def check_length(num_prompt: int, max_tokens: int, max_model_len: int) -> None:
    """The prompt plus the tokens asked for must fit the model's context."""
    if num_prompt >= max_model_len:
        raise InvalidRequestError(
            "prompt", f"{num_prompt} tokens; max_model_len is {max_model_len}"
        )
    if num_prompt + max_tokens > max_model_len:
        raise InvalidRequestError(
            "max_tokens",
            f"prompt ({num_prompt}) + max_tokens ({max_tokens}) exceeds "
            f"max_model_len ({max_model_len})",
        )


def check_prompt_chars(
    num_chars: int,
    max_token_chars: int | None,
    max_tokens: int | None,
    max_model_len: int,
    field: str = "prompt",
) -> None:
    """Refuse, without tokenizing, a text of ``num_chars`` characters that cannot fit.

    One token stands for at most ``max_token_chars`` characters (RouterTokenizer works it out
    once at load; None when the tokenizer gives no such bound), so the text is at least
    ceil(num_chars / max_token_chars) tokens: a lower bound, so whatever this refuses
    ``check_length`` would refuse after tokenizing too, and it never refuses a prompt that
    fits. ``max_tokens`` is the client's (None when it set none: the default then shrinks to
    the room left).
    """
    if max_token_chars is None:
        return
    at_least = -(-num_chars // max_token_chars)
    if at_least >= max_model_len:
        raise InvalidRequestError(
            field,
            f"{num_chars} characters is at least {at_least} tokens; "
            f"max_model_len is {max_model_len}",
        )
    if max_tokens is not None and at_least + max_tokens > max_model_len:
        raise InvalidRequestError(
            "max_tokens",
            f"prompt (at least {at_least} tokens) + max_tokens ({max_tokens}) exceeds "
            f"max_model_len ({max_model_len})",
        )


def _finite(value: float, name: str) -> None:
    if math.isnan(value) or math.isinf(value):
        raise InvalidRequestError(name, f"must be finite, got {value}")
