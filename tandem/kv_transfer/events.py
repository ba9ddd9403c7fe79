"""What the receiver reports to the decode worker: how each reservation ended.

Every reservation ends exactly once. ``release`` ends it silently (the caller asked); every other
end puts one of these on ``Receiver.events``. After the event the blocks are the decode worker's
again: it runs the request (``Committed``) or frees them (``Aborted``, ``Expired``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True, slots=True)
class Committed:
    """All layers arrived intact; the request may join the decode batch. A forked request
    (n sequences sharing the prompt's KV) also carries sequences 1..n-1's first tokens."""

    transfer_id: str
    block_ids: tuple[int, ...]
    first_token: int
    logprob: float
    seconds: float = field(default=0.0, compare=False)  # first KV frame to COMMIT, here
    forked_tokens: tuple[int, ...] = ()  # first tokens of sequences 1..n-1
    forked_logprobs: tuple[float, ...] = ()

    @property
    def first_tokens(self) -> tuple[int, ...]:
        """Every sequence's first token, in order (one for a request that is not forked)."""
        return (self.first_token, *self.forked_tokens)

    @property
    def first_logprobs(self) -> tuple[float, ...]:
        """Their logprobs, in the same order."""
        return (self.logprob, *self.forked_logprobs)


@dataclass(frozen=True, slots=True)
class Aborted:
    """The transfer failed before commit. ``code`` is the NACK-style code (e.g. "checksum")."""

    transfer_id: str
    block_ids: tuple[int, ...]
    code: str
    reason: str
    by: Literal["sender", "receiver", "network"]


@dataclass(frozen=True, slots=True)
class Expired:
    """The lease ended before COMMIT: no BEGIN in time, no frame for the progress timeout,
    or the sender's deadline passed."""

    transfer_id: str
    block_ids: tuple[int, ...]


TransferEvent = Committed | Aborted | Expired
