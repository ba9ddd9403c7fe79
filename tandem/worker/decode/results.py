"""What the decode worker's calls return (plain values; the servicer makes protos of them).

    Reserve      ──> ReserveResult   where and into which blocks the prefill worker pushes
    Decode       ──> StreamMessage…  a sequence's outputs after its first token
    PrefillLocal ──> FirstToken      (tandem/worker/first_token.py, shared with the prefill role)
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.engine.outputs import RequestOutput
from tandem.kv_transfer import KvLayout


@dataclass(frozen=True, slots=True)
class ReserveResult:
    """Where and into which blocks a prefill worker pushes a request's KV."""

    transfer_id: str
    block_ids: list[int]  # the blocks the push fills: those after skip_tokens
    kv_endpoint: str  # kv_transfer Endpoint.encode(): host id plus one address per transport
    layout: KvLayout
    cached_tokens: int = 0  # leading prompt tokens already held here (prefix cache)
    lora_identity: str = ""  # the request's LoRA adapter here (name@digest; "": base model)
    # leading prompt tokens not pushed: the cached ones, or (every layer sliding) those
    # before the first decoded token's window
    skip_tokens: int = 0


@dataclass(frozen=True, slots=True)
class StreamMessage:
    """One Decode stream message: an engine output of sequence ``index``, after the text an
    earlier output left unsent (the first token's: the router has that token from the
    prefill's answer, its text comes here so the stream's texts make the whole completion)."""

    output: RequestOutput
    index: int = 0  # the sequence of a forked request (0 otherwise)
    text_prefix: str = ""

    @property
    def finished(self) -> bool:
        """True on the stream's last message."""
        return self.output.finished

    @property
    def token_ids(self) -> list[int]:
        """The tokens this message carries."""
        return self.output.new_token_ids
