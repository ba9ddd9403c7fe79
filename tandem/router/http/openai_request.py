"""OpenAI request JSON -> the same plain ``GenerateRequest`` (tandem/router/api) the gRPC API's
requests become.

Only shapes and types are checked here (what a field of the wire's GenerateRequest would
hold: a string, an unsigned 32-bit integer, ...); the ranges (temperature >= 0, top_p in
(0, 1], max_tokens >= 1, ...) are tandem/router/validation.py's, applied by
``Frontend.accept`` exactly as for a gRPC request. Numbers bound for the wire's 32-bit float
fields are rounded to 32 bits here, so they are checked as a worker will read them (and as a
gRPC request's are). A bad field raises
InvalidRequestError naming it, which the HTTP edge turns into a 400 with ``param`` set.

Besides OpenAI's fields, the vLLM-style extras ``top_k``, ``min_p``, ``repetition_penalty``,
``min_tokens``, ``ignore_eos``, ``stop_token_ids``, ``skip_special_tokens``,
``include_stop_str_in_output`` and ``speculative`` (false: no speculative decoding for this
request) are accepted (the ``openai`` client sends them via ``extra_body``), and so are
structured outputs (tandem/router/http/structured.py) and ``logit_bias``. A chat also takes
vLLM's ``chat_template_kwargs`` (extra template variables: ``{"enable_thinking": false}``
switches Qwen3's thinking off) and ``include_reasoning`` (false: a reasoning parser's thinking
is dropped from the answer rather than returned apart).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from tandem.common.wire import MAX_SEQUENCES
from tandem.router.api.chat import Chat, TemplateValue
from tandem.router.api.request import GenerateRequest, Prompt
from tandem.router.api.sampling import LogprobOptions, SamplingSpec
from tandem.router.errors import InvalidRequestError
from tandem.router.http.chat_tools import MessageTools, parse_chat_tools
from tandem.router.http.structured import parse_structured

_UINT32 = 2**32 - 1


class Endpoint(Enum):
    """Which OpenAI API a request came in on (it shapes the response)."""

    COMPLETIONS = "completions"
    CHAT = "chat"


MAX_BATCH = 256  # prompts in one completions request
MAX_N = MAX_SEQUENCES  # OpenAI's limit on n (128): the workers fork at most that many
MAX_BEST_OF = 20  # and on best_of


@dataclass(slots=True)
class ApiRequest:
    """A parsed OpenAI request: the plain request plus how to deliver its answer.

    A completions batch (``prompt`` a list of prompts) is one request per prompt in
    ``requests`` (``request`` is the first); ``echo`` puts each prompt before its choice's
    text (and, with logprobs, its tokens' logprobs before the completion's). ``n`` choices
    per prompt, the best ``n`` of ``best_of`` samples by cumulative logprob when ``best_of``
    is larger (tandem/router/http/fanout.py runs them). ``functions``: a chat request that came with
    the legacy ``functions``, answered in the legacy ``function_call`` shape.
    ``include_reasoning``: a chat's thinking (under a reasoning parser) comes back in
    ``reasoning_content``; false drops it."""

    endpoint: Endpoint
    request: GenerateRequest
    stream: bool = False
    include_usage: bool = False
    echo: bool = False
    requests: list[GenerateRequest] = field(default_factory=list)
    n: int = 1
    best_of: int = 1
    functions: bool = False
    include_reasoning: bool = True

    def __post_init__(self) -> None:
        if not self.requests:
            self.requests = [self.request]


def parse(endpoint: Endpoint, body: Any) -> ApiRequest:
    """Map a decoded JSON body of ``endpoint``; raises InvalidRequestError."""
    if not isinstance(body, dict):
        raise InvalidRequestError("body", "must be a JSON object")
    model = _opt(body, "model", str) or ""
    sampling: dict[str, Any] = {}  # SamplingSpec's fields the body sets
    functions = False
    if endpoint is Endpoint.CHAT:
        chat, logprobs, functions = _chat(body, sampling)
        prompts: list[Prompt] = [chat]
    else:
        prompts, logprobs = _completion(body, sampling)
    _sampling(body, sampling)
    structured = parse_structured(body)
    if structured is not None:
        sampling["structured"] = structured
    user = _opt(body, "user", str) or ""
    request = GenerateRequest(prompt=prompts[0], sampling=SamplingSpec(**sampling),
                              logprobs=logprobs, model=model, user=user,
                              separate_reasoning=endpoint is Endpoint.CHAT)
    n = _opt(body, "n", int)
    n = 1 if n is None else n
    if not 1 <= n <= MAX_N:
        raise InvalidRequestError("n", f"must be in [1, {MAX_N}], got {n}")
    best_of = _opt(body, "best_of", int) if endpoint is Endpoint.COMPLETIONS else None
    if best_of is None:
        best_of = n
    elif not n <= best_of <= MAX_BEST_OF:
        raise InvalidRequestError("best_of", f"must be in [n, {MAX_BEST_OF}], got {best_of}")
    stream = bool(_opt(body, "stream", bool))
    options = _opt(body, "stream_options", dict) or {}
    include_usage = _opt(options, "include_usage", bool, "stream_options.include_usage")
    echo = endpoint is Endpoint.COMPLETIONS and bool(_opt(body, "echo", bool))
    requests = [replace(request, prompt=p) for p in prompts] if len(prompts) > 1 else []
    if requests and stream:
        raise InvalidRequestError("stream", "a batch of prompts cannot be streamed; send one")
    if stream and best_of > n:
        raise InvalidRequestError("best_of", "cannot be streamed when larger than n")
    include_reasoning = _opt(body, "include_reasoning", bool)
    return ApiRequest(endpoint, request, stream, bool(stream and include_usage), echo,
                      requests, n, best_of, functions, include_reasoning is not False)


def _completion(body: dict[str, Any], sampling: dict[str, Any]
                ) -> tuple[list[Prompt], LogprobOptions]:
    """A completions body's prompts (a batch: several) and logprob options; its sampling
    fields into ``sampling``."""
    prompts = _prompts(body.get("prompt"))
    _opt(body, "echo", bool)
    if body.get("suffix"):
        raise InvalidRequestError("suffix", "suffix is not supported")
    options = LogprobOptions()
    logprobs = _opt(body, "logprobs", int)
    if logprobs is not None:
        options = LogprobOptions(enabled=True, top_logprobs=_non_negative(logprobs, "logprobs"))
        if body.get("echo"):  # the prompt's tokens come back with logprobs too
            sampling["prompt_logprobs"] = options.top_logprobs
    prompt_logprobs = _opt(body, "prompt_logprobs", int)  # vLLM's extra
    if prompt_logprobs is not None:
        sampling["prompt_logprobs"] = _non_negative(prompt_logprobs, "prompt_logprobs")
    _opt_uint(body, ("max_tokens",), sampling, "max_tokens")
    return prompts, options


def _prompts(prompt: Any) -> list[Prompt]:
    """A completions ``prompt``: a string, token ids, or a batch (a list of either)."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        return [_token_ids(prompt, "prompt")]
    if isinstance(prompt, list) and prompt:
        if len(prompt) > MAX_BATCH:
            raise InvalidRequestError("prompt", f"at most {MAX_BATCH} prompts in a batch")
        out: list[Prompt] = []
        for i, p in enumerate(prompt):
            if isinstance(p, str):
                out.append(p)
            elif isinstance(p, list) and p and all(_is_int(t) for t in p):
                out.append(_token_ids(p, f"prompt[{i}]"))
            else:
                raise InvalidRequestError(f"prompt[{i}]", "must be a string or token ids")
        return out
    raise InvalidRequestError("prompt", "must be a string or a list of token ids")


def _token_ids(ids: list[int], field: str) -> tuple[int, ...]:
    if any(t < 0 or t > _UINT32 for t in ids):
        raise InvalidRequestError(field, "token ids must be non-negative")
    return tuple(ids)


def _chat(body: dict[str, Any], sampling: dict[str, Any]
          ) -> tuple[Chat, LogprobOptions, bool]:
    """A chat body's messages and tools, its logprob options, and whether it came with the
    legacy ``functions``; its sampling fields into ``sampling``."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages", "must be a non-empty list")
    history = MessageTools()
    parsed = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequestError(f"messages[{i}]", "must be an object")
        role = _opt(message, "role", str, f"messages[{i}].role") or ""
        # OpenAI's newer name for the system prompt.
        role = "system" if role == "developer" else role
        content = _content(message.get("content"), f"messages[{i}].content")
        parsed.append(history.add(message, i, role, content))
    add_generation_prompt = _opt(body, "add_generation_prompt", bool)
    tools = parse_chat_tools(body)
    chat = Chat(messages=tuple(parsed),
                add_generation_prompt=True if add_generation_prompt is None
                else add_generation_prompt,
                tools_json=tools.tools_json, tool_choice=tools.tool_choice,
                parallel_tool_calls=tools.parallel_tool_calls,
                template_kwargs=template_kwargs(body))
    options = LogprobOptions()
    top = _opt(body, "top_logprobs", int)
    if _opt(body, "logprobs", bool):
        options = LogprobOptions(enabled=True, top_logprobs=_non_negative(top or 0, "top_logprobs"))
    elif top:
        raise InvalidRequestError("top_logprobs", "needs logprobs: true")
    _opt_uint(body, ("max_completion_tokens", "max_tokens"), sampling, "max_tokens")
    return chat, options, tools.legacy


def template_kwargs(body: dict[str, Any]) -> tuple[tuple[str, TemplateValue], ...]:
    """vLLM's ``chat_template_kwargs``: extra variables for the chat template, each a name
    (an identifier, not one the request sets itself) and a JSON scalar."""
    given = _opt(body, "chat_template_kwargs", dict) or {}
    if len(given) > MAX_TEMPLATE_KWARGS:
        raise InvalidRequestError("chat_template_kwargs",
                                  f"{len(given)} entries; at most {MAX_TEMPLATE_KWARGS}")
    out: list[tuple[str, TemplateValue]] = []
    for name, value in given.items():
        field = f"chat_template_kwargs.{name}"
        if not name.isidentifier() or name.startswith("_") or name in _TEMPLATE_OWN:
            raise InvalidRequestError(field, "not a name a request may set for the template")
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise InvalidRequestError(field, "must be a string, number, boolean or null")
        out.append((name, value))
    return tuple(out)


MAX_TEMPLATE_KWARGS = 32
# Variables the request sets itself (the tokenizer refuses any other apply_chat_template
# parameter too).
_TEMPLATE_OWN = frozenset({"messages", "tools", "documents", "add_generation_prompt",
                           "continue_final_message", "chat_template", "tokenize"})


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


def _sampling(body: dict[str, Any], s: dict[str, Any]) -> None:
    """The body's sampling fields (shared by both endpoints) into ``s``."""
    for name in ("temperature", "top_p", "min_p", "repetition_penalty",
                 "presence_penalty", "frequency_penalty"):
        value = _opt(body, name, float)
        if value is not None:
            s[name] = _float32(value)
    top_k = _opt(body, "top_k", int)
    if top_k is not None:
        if not -(2**31) <= top_k < 2**31:
            raise InvalidRequestError("top_k", "out of range")
        s["top_k"] = top_k
    _opt_uint(body, ("min_tokens",), s, "min_tokens")
    seed = _opt(body, "seed", int)
    if seed is not None:
        s["seed"] = _non_negative(seed, "seed", 2**64 - 1)
    stop = body.get("stop")
    if isinstance(stop, str):
        s["stop"] = (stop,)
    elif isinstance(stop, list) and all(isinstance(x, str) for x in stop):
        s["stop"] = tuple(stop)
    elif stop is not None:
        raise InvalidRequestError("stop", "must be a string or a list of strings")
    ids = body.get("stop_token_ids")
    if ids is not None:
        if not isinstance(ids, list) or not all(_is_int(t) and 0 <= t <= _UINT32 for t in ids):
            raise InvalidRequestError("stop_token_ids", "must be a list of token ids")
        s["stop_token_ids"] = tuple(ids)
    s["ignore_eos"] = bool(_opt(body, "ignore_eos", bool))
    s["include_stop_str_in_output"] = bool(_opt(body, "include_stop_str_in_output", bool))
    skip = _opt(body, "skip_special_tokens", bool)
    if skip is not None:
        s["skip_special_tokens"] = skip
    speculative = _opt(body, "speculative", bool)
    if speculative is not None:
        s["speculative"] = speculative
    bias = _logit_bias(body)
    if bias:
        s["logit_bias"] = bias


def _opt_uint(body: dict[str, Any], names: tuple[str, ...], s: dict[str, Any], attr: str
              ) -> None:
    """Set ``s[attr]`` from the first of ``names`` present (OpenAI has aliases)."""
    for name in names:
        value = _opt(body, name, int)
        if value is not None:
            s[attr] = _non_negative(value, name)
            return


def _logit_bias(body: dict[str, Any]) -> dict[int, float]:
    """OpenAI's ``{"token id": bias}`` (keys are strings in JSON)."""
    bias = _opt(body, "logit_bias", dict)
    out: dict[int, float] = {}
    for key, value in (bias or {}).items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise InvalidRequestError("logit_bias", f"key {key!r} is not a token id") from None
        if not 0 <= token <= _UINT32:
            raise InvalidRequestError("logit_bias", f"key {key!r} is not a token id")
        if not (_is_int(value) or isinstance(value, float)):
            raise InvalidRequestError("logit_bias", f"bias of {key!r} must be a number")
        out[token] = _float32(float(value))
    return out


def _float32(value: float) -> float:
    """``value`` as the wire's 32-bit float fields hold it (beyond their range: infinite)."""
    return ctypes.c_float(value).value


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
