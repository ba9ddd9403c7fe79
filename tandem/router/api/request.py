"""What a client asks of the router: a generation, or a tokenization.

    prompt   str              a text, tokenized by the router
             tuple[int, ...]  token ids, used as they are
             Chat             messages, rendered through the chat template, then tokenized
             None             no prompt (refused by validation)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tandem.router.api.chat import Chat
from tandem.router.api.sampling import LogprobOptions, SamplingSpec

Prompt = str | tuple[int, ...] | Chat
PromptKind = Literal["text", "token_ids", "chat"]


def prompt_kind(prompt: Prompt | None) -> PromptKind | None:
    """Which of the three prompt forms ``prompt`` is (None: none was given)."""
    if prompt is None:
        return None
    if isinstance(prompt, str):
        return "text"
    if isinstance(prompt, Chat):
        return "chat"
    return "token_ids"


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """One prompt to generate from, as the gRPC and HTTP APIs both take it.

    ``request_id`` is the client's own label for it ("" : none), echoed back and logged only;
    ``user`` is its end-user label, logged and never interpreted. ``separate_reasoning``: a
    chat whose thinking comes back apart from its answer (``ResponseChunk.reasoning``) when
    the router runs a reasoning parser; the APIs whose answers have a place for it ask (the
    HTTP chat and Responses APIs), others get the thinking in the text.
    """

    prompt: Prompt | None = None
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    logprobs: LogprobOptions = field(default_factory=LogprobOptions)
    model: str = ""  # must match the served model when set
    request_id: str = ""
    user: str = ""
    separate_reasoning: bool = False

    @property
    def kind(self) -> PromptKind | None:
        """Which form the prompt takes (None without one)."""
        return prompt_kind(self.prompt)


@dataclass(frozen=True, slots=True)
class TokenizeRequest:
    """A text or chat input to tokenize as Generate would (``text`` None and ``chat`` None:
    refused). ``add_special_tokens`` applies to a text."""

    text: str | None = None
    chat: Chat | None = None
    model: str = ""
    add_special_tokens: bool = False
