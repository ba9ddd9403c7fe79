"""OpenAI request JSON -> the same ``GenerateRequest`` the gRPC API takes.

Only shapes and types are checked here (what a protobuf field needs to be set at all); the
ranges (temperature >= 0, top_p in (0, 1], max_tokens >= 1, ...) are router/validation.py's,
applied by ``Frontend.prepare`` exactly as for a gRPC request. A bad field raises
InvalidRequestError naming it, which the HTTP edge turns into a 400 with ``param`` set.

Besides OpenAI's fields, the vLLM-style extras ``top_k``, ``min_p``, ``repetition_penalty``,
``min_tokens``, ``ignore_eos``, ``stop_token_ids``, ``skip_special_tokens``,
``include_stop_str_in_output`` and ``speculative`` (false: no speculative decoding for this
request) are accepted (the ``openai`` client sends them via
``extra_body``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from protos.tandem.v1 import tandem_pb2
from router.errors import InvalidRequestError

_UINT32 = 2**32 - 1


class Endpoint(Enum):
    """Which OpenAI API a request came in on (it shapes the response)."""

    COMPLETIONS = "completions"
    CHAT = "chat"


@dataclass(slots=True)
class ApiRequest:
    """A parsed OpenAI request: the gRPC request plus how to deliver its answer."""

    endpoint: Endpoint
    request: tandem_pb2.GenerateRequest
    stream: bool = False
    include_usage: bool = False


def parse(endpoint: Endpoint, body: Any) -> ApiRequest:
    """Map a decoded JSON body of ``endpoint``; raises InvalidRequestError."""
    if not isinstance(body, dict):
        raise InvalidRequestError("body", "must be a JSON object")
    request = tandem_pb2.GenerateRequest()
    model = _opt(body, "model", str)
    if model:
        request.model = model
    if endpoint is Endpoint.CHAT:
        _chat(body, request)
    else:
        _completion(body, request)
    _sampling(body, request.sampling)
    n = _opt(body, "n", int)
    if n is not None and n != 1:
        raise InvalidRequestError("n", f"only n=1 is supported, got {n}; send one request per sample")
    stream = bool(_opt(body, "stream", bool))
    options = _opt(body, "stream_options", dict) or {}
    include_usage = _opt(options, "include_usage", bool, "stream_options.include_usage")
    return ApiRequest(endpoint, request, stream, bool(stream and include_usage))


def _completion(body: dict[str, Any], request: tandem_pb2.GenerateRequest) -> None:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one is one prompt
    if isinstance(prompt, str):
        request.text = prompt
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        if any(t < 0 or t > _UINT32 for t in prompt):
            raise InvalidRequestError("prompt", "token ids must be non-negative")
        request.token_ids.ids.extend(prompt)
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise InvalidRequestError("prompt", "batched prompts are not supported; send one each")
    else:
        raise InvalidRequestError("prompt", "must be a string or a list of token ids")
    if body.get("echo"):
        raise InvalidRequestError("echo", "echo is not supported")
    if body.get("suffix"):
        raise InvalidRequestError("suffix", "suffix is not supported")
    best_of = _opt(body, "best_of", int)
    if best_of is not None and best_of != 1:
        raise InvalidRequestError("best_of", "only best_of=1 is supported")
    _no_logit_bias(body)
    logprobs = _opt(body, "logprobs", int)
    if logprobs is not None:
        request.logprobs.enabled = True
        request.logprobs.top_logprobs = _non_negative(logprobs, "logprobs")
    _opt_uint(body, ("max_tokens",), request.sampling, "max_tokens")


def _chat(body: dict[str, Any], request: tandem_pb2.GenerateRequest) -> None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages", "must be a non-empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequestError(f"messages[{i}]", "must be an object")
        role = _opt(message, "role", str, f"messages[{i}].role") or ""
        # OpenAI's newer name for the system prompt.
        role = "system" if role == "developer" else role
        content = _content(message.get("content"), f"messages[{i}].content")
        request.chat.messages.add(role=role, content=content)
    add_generation_prompt = _opt(body, "add_generation_prompt", bool)
    if add_generation_prompt is not None:
        request.chat.add_generation_prompt = add_generation_prompt
    for name in ("tools", "functions"):
        if body.get(name):
            raise InvalidRequestError(name, f"{name} are not supported")
    response_format = _opt(body, "response_format", dict)
    if response_format and response_format.get("type", "text") != "text":
        raise InvalidRequestError("response_format", "only type 'text' is supported")
    _no_logit_bias(body)
    top = _opt(body, "top_logprobs", int)
    if _opt(body, "logprobs", bool):
        request.logprobs.enabled = True
        request.logprobs.top_logprobs = _non_negative(top or 0, "top_logprobs")
    elif top:
        raise InvalidRequestError("top_logprobs", "needs logprobs: true")
    _opt_uint(body, ("max_completion_tokens", "max_tokens"), request.sampling, "max_tokens")


def _content(content: Any, field: str) -> str:
    """A message's text: a string, or a list of ``{"type": "text", "text": ...}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise InvalidRequestError(field, "only text content parts are supported")
            text = part.get("text")
            if not isinstance(text, str):
                raise InvalidRequestError(field, "a text part needs a string 'text'")
            texts.append(text)
        return "".join(texts)
    if content is None:
        return ""  # validation reports the missing content with its index
    raise InvalidRequestError(field, "must be a string or a list of text parts")


def _sampling(body: dict[str, Any], s: tandem_pb2.SamplingParams) -> None:
    for name in ("temperature", "top_p", "min_p", "repetition_penalty",
                 "presence_penalty", "frequency_penalty"):
        value = _opt(body, name, float)
        if value is not None:
            setattr(s, name, value)
    top_k = _opt(body, "top_k", int)
    if top_k is not None:
        if not -(2**31) <= top_k < 2**31:
            raise InvalidRequestError("top_k", "out of range")
        s.top_k = top_k
    _opt_uint(body, ("min_tokens",), s, "min_tokens")
    seed = _opt(body, "seed", int)
    if seed is not None:
        s.seed = _non_negative(seed, "seed", 2**64 - 1)
    stop = body.get("stop")
    if isinstance(stop, str):
        s.stop.append(stop)
    elif isinstance(stop, list) and all(isinstance(x, str) for x in stop):
        s.stop.extend(stop)
    elif stop is not None:
        raise InvalidRequestError("stop", "must be a string or a list of strings")
    ids = body.get("stop_token_ids")
    if ids is not None:
        if not isinstance(ids, list) or not all(_is_int(t) and 0 <= t <= _UINT32 for t in ids):
            raise InvalidRequestError("stop_token_ids", "must be a list of token ids")
        s.stop_token_ids.extend(ids)
    s.ignore_eos = bool(_opt(body, "ignore_eos", bool))
    s.include_stop_str_in_output = bool(_opt(body, "include_stop_str_in_output", bool))
    skip = _opt(body, "skip_special_tokens", bool)
    if skip is not None:
        s.skip_special_tokens = skip
    speculative = _opt(body, "speculative", bool)
    if speculative is not None:
        s.speculative = speculative


def _opt_uint(
    body: dict[str, Any], names: tuple[str, ...], s: tandem_pb2.SamplingParams, attr: str
) -> None:
    """Set ``attr`` from the first of ``names`` present (OpenAI has aliases)."""
    for name in names:
        value = _opt(body, name, int)
        if value is not None:
            setattr(s, attr, _non_negative(value, name))
            return


def _no_logit_bias(body: dict[str, Any]) -> None:
    if body.get("logit_bias"):
        raise InvalidRequestError("logit_bias", "logit_bias is not supported")


def _non_negative(value: int, field: str, limit: int = _UINT32) -> int:
    if not 0 <= value <= limit:
        raise InvalidRequestError(field, f"must be a non-negative integer, got {value}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _opt(body: dict[str, Any], name: str, kind: type, field: str | None = None) -> Any:
    """``body[name]`` if present and not null, checked to be of ``kind`` (ints are floats)."""
    value = body.get(name)
    if value is None:
        return None
    field = field or name
    if kind is int and not _is_int(value):
        raise InvalidRequestError(field, "must be an integer")
    if kind is float:
        if not (_is_int(value) or isinstance(value, float)):
            raise InvalidRequestError(field, "must be a number")
        return float(value)
    if kind is not int and not isinstance(value, kind):
        raise InvalidRequestError(field, f"must be a {_NAMES.get(kind, kind.__name__)}")
    return value


_NAMES = {bool: "boolean", str: "string", dict: "JSON object", list: "list"}
