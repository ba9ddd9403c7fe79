"""What a request costs the router, in the two units every admission budget counts.

    cost = (sequences, prompt tokens)
    sequences      one per sequence the workers decode: a prompt forked into k = max(n, best_of)
                   is k; a completions batch of p prompts is p x k
    prompt tokens  one prompt's tokens, counted once however many sequences share its KV

The global gate (tandem/router/admission.py) and each client's share
(tandem/router/client_limits.py) are bounded in both; both front doors charge through
``prompt_tokens`` so a gRPC and an HTTP request of the same prompt cost the same.

A prompt is charged before it is tokenized (admission comes first, tokenizing is work): token
ids by their count, a text by its length in characters, a chat by its messages', tools' and
template variables' characters, each capped at the context length (no admitted prompt is
longer). A token is one or more characters for nearly all text, so a text is charged at least
its tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.router.api.chat import Chat
from tandem.router.api.request import Prompt


@dataclass(frozen=True, slots=True)
class Cost:
    """Sequences and prompt tokens one request holds while it runs (or waits)."""

    sequences: int
    tokens: int

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.sequences + other.sequences, self.tokens + other.tokens)

    def __sub__(self, other: Cost) -> Cost:
        return Cost(self.sequences - other.sequences, self.tokens - other.tokens)

    def within(self, bound: Cost) -> bool:
        """Whether both units are inside ``bound`` (a 0 in ``bound`` bounds nothing)."""
        return ((not bound.sequences or self.sequences <= bound.sequences)
                and (not bound.tokens or self.tokens <= bound.tokens))

    def over(self, bound: Cost) -> str | None:
        """The unit (as words) in which this exceeds ``bound``, or None when within it."""
        if bound.sequences and self.sequences > bound.sequences:
            return f"{self.sequences} sequences (at most {bound.sequences})"
        if bound.tokens and self.tokens > bound.tokens:
            return f"{self.tokens} prompt tokens (at most {bound.tokens})"
        return None


NOTHING = Cost(0, 0)
ONE = Cost(1, 0)  # what a request is charged before its body is read


def prompt_tokens(prompt: Prompt | None, max_model_len: int) -> int:
    """A prompt's charge in tokens before tokenizing (see the module docstring)."""
    if prompt is None:
        return 0
    if isinstance(prompt, tuple):
        size = len(prompt)
    elif isinstance(prompt, str):
        size = len(prompt)
    else:
        size = _chat_chars(prompt)
    return min(size, max_model_len)


def request_cost(prompt: Prompt | None, sequences: int, max_model_len: int) -> Cost:
    """One prompt decoded as ``sequences`` sequences."""
    return Cost(sequences, prompt_tokens(prompt, max_model_len))


def _chat_chars(chat: Chat) -> int:
    size = len(chat.tools_json)
    for message in chat.messages:
        size += len(message.content)
    for name, value in chat.template_kwargs:  # a template may write them into the prompt
        size += len(name) + (len(value) if isinstance(value, str) else 0)
    return size
