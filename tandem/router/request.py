"""A request's data as it moves through the router: accepted and prepared input, output
chunks, report.

    GenerateRequest --checks that need no tokenizer--> Accepted --admitted, tokenized--> Prepared

Ids: ``request_id`` is minted by the router for every request and is the only id a worker
ever sees (leg ids derive from it); ``label`` is the client's own request id (or the minted
one when it sent none), echoed back to that client and nowhere else. Two clients that pick
the same id can therefore never touch each other's legs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tandem.common.obs.tracing import Parent
from tandem.router.api.request import GenerateRequest
from tandem.router.api.response import TokenLogprob
from tandem.router.api.sampling import LogprobOptions, SamplingSpec
from tandem.router.reasoning import ReasoningParser
from tandem.router.tool_use import ToolUse


@dataclass(slots=True)
class Accepted:
    """A request that passed every check needing no tokenizer: it waits for admission."""

    request: GenerateRequest
    request_id: str  # router-minted
    label: str  # what the client sees as the request's id
    arrival: float = field(default_factory=time.perf_counter)
    tools: ToolUse | None = None  # a chat request's tools (tandem/router/tool_use.py)
    trace_parent: Parent = None  # the client's trace context its span continues
    n: int = 1  # sequences to fork the prompt into (the HTTP fan-out's n / best_of)
    reasoning: ReasoningParser | None = None  # splits its thinking from its answer
    lora: str = ""  # the LoRA adapter identity (name@digest) its model names ("": the base)


@dataclass(slots=True)
class Prepared:
    """A validated, tokenized request, ready for the handoff."""

    request_id: str  # router-minted: what the workers see
    prompt_ids: list[int]
    sampling: SamplingSpec  # the model's defaults applied, max_tokens settled
    logprobs: LogprobOptions
    max_tokens: int
    arrival: float = field(default_factory=time.perf_counter)  # when the router got it
    label: str = ""  # the client's id for it ("" : request_id)
    # max_tokens 0 (score the prompt only): the workers generate one token nobody is sent
    score_only: bool = False
    # sequences from this prompt (n / best_of): the workers compute and push the prompt once
    # and fork it; chunks and responses carry each sequence's index
    n: int = 1
    # the LoRA adapter it runs under, by identity (name@digest; "": the base model): only
    # workers serving exactly that adapter take it, and its prefix hashes are salted by it
    lora: str = ""


@dataclass(slots=True)
class Chunk:
    """New tokens for the client; ``text`` is the worker's own delta ("" when it sent none)."""

    token_ids: list[int]
    logprobs: list[TokenLogprob] = field(default_factory=list)
    text: str = ""
    finished: bool = False
    finish_reason: str = ""
    stop_reason: str = ""
    leg_start: bool = False  # the first token of a leg (from a prefill reply)
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # first only
    index: int = 0  # the sequence of a forked request it belongs to


@dataclass(slots=True)
class HandoffReport:
    """What the legs reported, for the last message's usage and timings."""

    cached_tokens: int = 0
    prefill_s: float = 0.0
    transfer_s: float = 0.0
    migrations: int = 0
