"""Caps on a request's shape, checked on what arrived (JSON values, protobuf fields) before
the router's plain types are built from it: building and validating 100,000 chat messages or
a million token ids takes a large slice of a second, so a count over its cap is refused first.

    fan-out     prompts x max(n, best_of) sequences   <= max_fanout     (--max-fanout)
    messages    messages in a chat, parts in one message <= max_messages (--max-messages)
    token ids   ids in one prompt (or one /detokenize)   <= max_token_ids (the context length:
                                                          no longer prompt can be served)

Each refusal is InvalidRequestError naming the field and the limit (400 / INVALID_ARGUMENT).
The HTTP edge applies these to the decoded JSON (tandem/router/http/body_limits.py), the
gRPC servicer to the message's repeated fields.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.router.errors import InvalidRequestError


@dataclass(frozen=True, slots=True)
class RequestCaps:
    """The three caps (see the module docstring)."""

    max_fanout: int
    max_messages: int
    max_token_ids: int

    def check_fanout(self, prompts: int, per_prompt: int, field: str) -> None:
        """``prompts`` each decoded as ``per_prompt`` sequences."""
        total = prompts * per_prompt
        if total > self.max_fanout:
            shape = f"{prompts} prompts x {per_prompt} = " if prompts > 1 else ""
            raise InvalidRequestError(
                field, f"{shape}{total} sequences; at most {self.max_fanout} per request "
                "(--max-fanout)")

    def check_messages(self, count: int, field: str, what: str = "messages") -> None:
        """``count`` messages (or one message's content parts)."""
        if count > self.max_messages:
            raise InvalidRequestError(
                field, f"{count} {what}; at most {self.max_messages} (--max-messages)")

    def check_token_ids(self, count: int, field: str) -> None:
        """``count`` token ids in one list."""
        if count > self.max_token_ids:
            raise InvalidRequestError(
                field, f"{count} token ids; at most {self.max_token_ids} (the context length)")
