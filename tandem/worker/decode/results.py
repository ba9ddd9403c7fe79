"""What the decode worker's calls return (plain values; the servicer makes protos of them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.engine.outputs import TokenLogprob
from tandem.kv_transfer import KvLayout
from tandem.protos.v1 import tandem_pb2


@dataclass(frozen=True, slots=True)
class ReserveResult:
    """Where and into which blocks a prefill worker pushes a request's KV."""

    transfer_id: str
    block_ids: list[int]  # the blocks the push fills: those after the cached prefix
    kv_endpoint: str  # kv_transfer Endpoint.encode(): host id plus one address per transport
    layout: KvLayout
    cached_tokens: int = 0  # leading prompt tokens already held here (prefix cache)


@dataclass(frozen=True, slots=True)
class FirstToken:
    """The first sampled token of a prefill, and what it cost."""

    token_id: int
    logprob: TokenLogprob | None
    cached_tokens: int
    prefill_s: float
    prompt_logprobs: list[tandem_pb2.TokenLogprob] = field(default_factory=list)  # asked for
    # a forked request's sequences 1..n-1: their first tokens (and logprobs when asked)
    forked: list[tuple[int, TokenLogprob | None]] = field(default_factory=list)
