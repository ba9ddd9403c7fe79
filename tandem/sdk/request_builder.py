"""Build the router's request messages from the SDK's keyword arguments (pure; shared by the
sync and async clients). Mistakes a caller can make locally (two prompts, an unknown sampling
option) raise ``InvalidRequest`` before any network call; value ranges are the router's to
check, so the two never disagree."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from tandem.protos.v1 import tandem_pb2
from tandem.sdk.errors import InvalidRequest
from tandem.sdk.sampling import SamplingOptions, merge_sampling

# SamplingParams fields by kind (tandem/protos/v1/tandem.proto).
_SCALAR = {
    "max_tokens": int, "min_tokens": int, "temperature": float, "top_p": float, "top_k": int,
    "min_p": float, "repetition_penalty": float, "presence_penalty": float,
    "frequency_penalty": float, "seed": int, "ignore_eos": bool,
    "include_stop_str_in_output": bool, "skip_special_tokens": bool, "speculative": bool,
    "prompt_logprobs": int,
}
_REPEATED = {"stop": str, "stop_token_ids": int}
# logit_bias: {token id: bias}; structured: one of {"json_schema": schema (dict or text),
# "json_object": True, "regex": str, "choice": [str, ...], "grammar": EBNF str}
_MAPPINGS = {"logit_bias", "structured"}
SAMPLING_FIELDS = frozenset(_SCALAR) | frozenset(_REPEATED) | frozenset(_MAPPINGS)
_STRUCTURED = ("json_schema", "json_object", "regex", "choice", "grammar")

Messages = Sequence[Mapping[str, str]]


def sampling_params(options: Mapping[str, Any]) -> tandem_pb2.SamplingParams:
    """A SamplingParams message from keyword options; None values are left unset (defaults)."""
    unknown = sorted(set(options) - SAMPLING_FIELDS)
    if unknown:
        raise InvalidRequest(
            f"unknown sampling option(s) {', '.join(unknown)}; known: "
            f"{', '.join(sorted(SAMPLING_FIELDS))}"
        )
    msg = tandem_pb2.SamplingParams()
    for name, value in options.items():
        if value is None:
            continue
        if name in _MAPPINGS:
            _mapping(msg, name, value)
            continue
        if name in _REPEATED:
            items = [value] if isinstance(value, (str, int)) else list(value)
            try:
                getattr(msg, name).extend(_REPEATED[name](v) for v in items)
            except (TypeError, ValueError) as err:
                raise InvalidRequest(f"sampling.{name}: {err}") from err
            continue
        kind = _SCALAR[name]
        if kind is not bool and isinstance(value, bool):
            raise InvalidRequest(f"sampling.{name}: expected a number, got {value!r}")
        try:
            setattr(msg, name, kind(value))
        except (TypeError, ValueError) as err:  # negative into uint32, non-numbers
            raise InvalidRequest(f"sampling.{name}: {err}") from err
    return msg


def _mapping(msg: tandem_pb2.SamplingParams, name: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise InvalidRequest(f"sampling.{name}: expected a mapping, got {type(value).__name__}")
    if name == "logit_bias":
        try:
            for token, bias in value.items():
                msg.logit_bias[int(token)] = float(bias)
        except (TypeError, ValueError) as err:
            raise InvalidRequest(f"sampling.logit_bias: {err}") from err
        return
    if len(value) != 1 or next(iter(value)) not in _STRUCTURED:
        raise InvalidRequest(f"sampling.structured: exactly one of {', '.join(_STRUCTURED)}")
    kind, spec = next(iter(value.items()))
    so = msg.structured
    if kind == "json_schema":
        so.json_schema = spec if isinstance(spec, str) else json.dumps(spec)
    elif kind == "json_object":
        so.json_object = bool(spec)
    elif kind == "choice":
        so.choice.choices.extend(str(c) for c in spec)
    else:
        setattr(so, kind, str(spec))


def chat_messages(
    messages: Messages, add_generation_prompt: bool = True
) -> tandem_pb2.ChatMessages:
    """ChatMessages from ``[{"role": ..., "content": ...}, ...]`` (the OpenAI shape)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidRequest("messages must be a list of {'role', 'content'} mappings")
    out = tandem_pb2.ChatMessages(add_generation_prompt=add_generation_prompt)
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise InvalidRequest(f"messages[{i}] must be a mapping with 'role' and 'content'")
        out.messages.append(tandem_pb2.ChatMessage(role=str(m["role"]), content=str(m["content"])))
    return out


def generate_request(
    prompt: str | None = None,
    *,
    messages: Messages | None = None,
    token_ids: Sequence[int] | None = None,
    model: str = "",
    request_id: str = "",
    logprobs: bool = False,
    top_logprobs: int = 0,
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_choice: str | None = None,
    parallel_tool_calls: bool | None = None,
    sampling: SamplingOptions | None = None,
    **options: Any,
) -> tandem_pb2.GenerateRequest:
    """A GenerateRequest from exactly one of ``prompt`` (raw text), ``messages`` (chat,
    rendered by the server's chat template) or ``token_ids``, plus sampling options: typed in
    ``sampling`` and/or as keywords (``max_tokens=...``), never the same field both ways.
    ``tools`` (OpenAI's list of functions), ``tool_choice`` (auto | none | required | a
    function's name) and ``parallel_tool_calls`` go with ``messages``."""
    try:
        merged = merge_sampling(sampling, options)
    except (TypeError, ValueError) as err:
        raise InvalidRequest(f"sampling: {err}") from err
    given = [n for n, v in (("prompt", prompt), ("messages", messages), ("token_ids", token_ids))
             if v is not None]
    if (tools or tool_choice) and messages is None:
        raise InvalidRequest("tools and tool_choice need messages (a chat prompt)")
    if len(given) != 1:
        raise InvalidRequest(
            "give exactly one of prompt, messages or token_ids"
            + (f" (got {', '.join(given)})" if given else "")
        )
    req = tandem_pb2.GenerateRequest(
        request_id=request_id, model=model, sampling=sampling_params(merged)
    )
    if prompt is not None:
        if not isinstance(prompt, str):
            raise InvalidRequest(f"prompt must be a str, got {type(prompt).__name__}")
        req.text = prompt
    elif messages is not None:
        req.chat.CopyFrom(chat_messages(messages, add_generation_prompt))
        if tools:
            req.chat.tools_json = json.dumps(list(tools))
        if tool_choice is not None:
            req.chat.tool_choice = tool_choice
        if parallel_tool_calls is not None:
            req.chat.parallel_tool_calls = parallel_tool_calls
    else:
        try:
            req.token_ids.CopyFrom(tandem_pb2.TokenIds(ids=[int(t) for t in token_ids or ()]))
        except (TypeError, ValueError) as err:
            raise InvalidRequest(f"token_ids: {err}") from err
    if logprobs or top_logprobs:
        if top_logprobs < 0:
            raise InvalidRequest("top_logprobs must be >= 0")
        req.logprobs.CopyFrom(tandem_pb2.LogprobOptions(enabled=True, top_logprobs=top_logprobs))
    return req


def tokenize_request(
    text: str | None = None,
    *,
    messages: Messages | None = None,
    model: str = "",
    add_special_tokens: bool = True,
    add_generation_prompt: bool = True,
) -> tandem_pb2.TokenizeRequest:
    """A TokenizeRequest for exactly one of ``text`` or chat ``messages``."""
    if (text is None) == (messages is None):
        raise InvalidRequest("give exactly one of text or messages")
    req = tandem_pb2.TokenizeRequest(model=model, add_special_tokens=add_special_tokens)
    if text is not None:
        req.text = text
    else:
        req.chat.CopyFrom(chat_messages(messages or (), add_generation_prompt))
    return req
