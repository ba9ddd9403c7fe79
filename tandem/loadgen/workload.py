"""Workload mixes for the serving benchmark: who arrives when, with how long a prompt.

A mix blends two request kinds, the two shapes that matter for disaggregation:

    rag   long prompt (retrieved context), short answer   -> prefill bursts
    chat  short prompt (a conversational turn), longer answer -> steady decode

Arrivals are a Poisson process (exponential gaps at ``rate`` requests/s). Prompts are random
token ids (fixed seed), so every run of a mix sends the same requests and no two requests share
a prefix by accident: prefix caching does not flatter either setup. (The multi-turn chat
workload, where sharing prefixes is the point, is tandem/loadgen/multiturn.py.)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# The request kinds and mixes are shared with the planner (one definition: the simulator
# replays the same shapes the benchmark sends).
from tandem.common.request_shapes import CHAT, MIXES, RAG, RequestKind, scale_range, scaled
from tandem.common.request_shapes import LengthMix as WorkloadMix

__all__ = ["CHAT", "MIXES", "RAG", "RequestKind", "RequestSpec", "WorkloadMix", "make_requests",
           "scaled", "scale_range", "check_load"]


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a run: when it is sent (seconds after start) and what it asks."""

    index: int
    arrival_s: float
    kind: str
    prompt_ids: tuple[int, ...]
    max_tokens: int


def check_load(rate: float, num_requests: int, vocab: tuple[int, int]) -> None:
    """ValueError unless ``rate`` > 0, ``num_requests`` >= 1 and ``vocab`` is a [lo, hi) range."""
    if rate <= 0 or num_requests < 1:
        raise ValueError("rate must be > 0 and num_requests >= 1")
    if not 0 <= vocab[0] < vocab[1]:
        raise ValueError(f"bad vocab range {vocab}")


def make_requests(
    mix: WorkloadMix,
    rate: float,
    num_requests: int,
    *,
    seed: int = 0,
    vocab: tuple[int, int] = (1000, 30000),
    scale: float = 1.0,
) -> list[RequestSpec]:
    """``num_requests`` requests of ``mix`` arriving as a Poisson process at ``rate``/s.

    ``vocab`` bounds the random token ids (half-open); keep it inside the model's vocabulary.
    """
    check_load(rate, num_requests, vocab)
    rng = random.Random(seed)
    kinds = [scaled(kind, scale) for kind, _ in mix.kinds]
    weights = [share for _, share in mix.kinds]
    specs: list[RequestSpec] = []
    t = 0.0
    for i in range(num_requests):
        if i:
            t += rng.expovariate(rate)
        kind = rng.choices(kinds, weights)[0]
        n_prompt = rng.randint(*kind.prompt_tokens)
        ids = tuple(rng.randrange(vocab[0], vocab[1]) for _ in range(n_prompt))
        specs.append(RequestSpec(i, t, kind.name, ids, rng.randint(*kind.output_tokens)))
    return specs
