"""vLLM's ``POST /tokenize`` and ``POST /detokenize`` bodies <-> the router's tokenizer.

    /tokenize   {"prompt": str, "add_special_tokens": true}            -> TokenizeRequest.text
                {"messages": [...], "add_generation_prompt": true,
                 "chat_template_kwargs": {...}}                          -> TokenizeRequest.chat
        (the plain TokenizeRequest of tandem/router/api/request.py)
        <- {"count", "max_model_len", "tokens"}
    /detokenize {"tokens": [ids]}  <- {"prompt": str}
"""

from __future__ import annotations

from typing import Any

from tandem.router.api.chat import Chat
from tandem.router.api.request import TokenizeRequest
from tandem.router.errors import InvalidRequestError
from tandem.router.http.body_limits import check_messages
from tandem.router.http.openai_request import Endpoint, parse
from tandem.router.request_caps import RequestCaps


def tokenize_request(body: Any, caps: RequestCaps) -> TokenizeRequest:
    """The TokenizeRequest of a /tokenize body (its messages capped before they are read);
    raises InvalidRequestError."""
    if not isinstance(body, dict):
        raise InvalidRequestError("body", "must be a JSON object")
    check_messages(body.get("messages"), caps)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequestError("model", "must be a string")
    special = body.get("add_special_tokens")
    if special is not None and not isinstance(special, bool):
        raise InvalidRequestError("add_special_tokens", "must be a boolean")
    if "messages" in body:
        chat = parse(Endpoint.CHAT, {"messages": body["messages"],
                                     **_only(body, "add_generation_prompt", "tools",
                                                "chat_template_kwargs")})
        assert isinstance(chat.request.prompt, Chat)
        return TokenizeRequest(chat=chat.request.prompt, model=model or "")
    if isinstance(body.get("prompt"), str):
        return TokenizeRequest(text=body["prompt"], model=model or "",
                               add_special_tokens=True if special is None else special)
    raise InvalidRequestError("prompt", "a string prompt or a messages list is required")


def detokenize_ids(body: Any, vocab_size: int, caps: RequestCaps) -> list[int]:
    """The token ids of a /detokenize body, each inside the vocabulary (their count capped
    before any is read)."""
    if not isinstance(body, dict):
        raise InvalidRequestError("body", "must be a JSON object")
    tokens = body.get("tokens")
    if not isinstance(tokens, list):
        raise InvalidRequestError("tokens", "must be a list of token ids")
    caps.check_token_ids(len(tokens), "tokens")
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
            raise InvalidRequestError("tokens", f"{t!r} is not a token id below {vocab_size}")
    return tokens


def _only(body: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: body[k] for k in keys if k in body}
