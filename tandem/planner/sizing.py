"""First-guess pool sizes from a profile and a workload's token mix (no simulation).

The planner starts its search here, then lets the simulator judge the neighbourhood::

    prompt tokens/s   Lp = rate * mean(prompt tokens not covered by a shared prefix)
    output tokens/s   Lo = rate * mean(output tokens)
    prefill worker    Cp = chunk / step(0 rows, chunk tokens)            tokens/s at full chunks
    decode worker     B  = the most rows with step(B rows) <= TPOT target, KV room and
                           max_num_seqs;  Cd = B / step(B rows)           tokens/s
    P = ceil(Lp / (Cp * u)),  D = ceil(Lo / (Cd * u))                      u = utilization cap

``u`` (default 0.7) leaves the queueing headroom a latency target needs; the simulator is
what says whether it was enough. Colocated: each worker's second is split between prompt and
output work at those same rates, so N = ceil((Lp / Cp + Lo / Cd) / u).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tandem.planner.profile import Profile
from tandem.planner.trace import TraceRequest


@dataclass(frozen=True, slots=True)
class TokenMix:
    """A workload's demand in tokens per second, and its mean request shape."""

    rate: float  # requests/s
    prompt_tokens_s: float  # prompt tokens/s that must be computed (shared prefixes excluded)
    output_tokens_s: float
    mean_context: float  # mean prompt + output / 2: what a decoding row attends to on average
    mean_kv_tokens: float  # mean prompt + output: what a request holds in KV at its end
    mean_prompt: float  # mean prompt tokens (cached or not)


@dataclass(frozen=True, slots=True)
class Sizing:
    """Pool sizes the token mix needs at utilization ``u``, and the per-worker rates used."""

    prefill: int
    decode: int
    colocated: int
    prefill_tokens_s: float  # one prefill worker at full chunks
    decode_tokens_s: float  # one decode worker at its best batch inside the TPOT target
    decode_rows: int  # that batch


def token_mix(trace: Sequence[TraceRequest]) -> TokenMix:
    """The demand of ``trace`` (its arrivals' span sets the rate)."""
    if not trace:
        raise ValueError("an empty trace has no demand")
    span = max(trace[-1].arrival_s - trace[0].arrival_s, 1e-9)
    rate = (len(trace) - 1) / span if len(trace) > 1 else 1.0
    n = len(trace)
    computed = sum(r.prompt_tokens - (r.prefix_tokens if r.prefix_group >= 0 else 0)
                   for r in trace) / n
    out = sum(r.output_tokens for r in trace) / n
    prompt = sum(r.prompt_tokens for r in trace) / n
    return TokenMix(rate, rate * max(computed, 1.0), rate * out, prompt + out / 2, prompt + out,
                    prompt)


def prefill_rate(profile: Profile, mean_prompt: float) -> float:
    """Prompt tokens/s of one worker running full chunks of prompts ``mean_prompt`` long."""
    chunk = profile.chunk_tokens
    # A chunk of whole prompts of mean length: each token attends to ~mean_prompt / 2 others.
    pairs = chunk * min(mean_prompt, chunk) / 2
    return chunk / profile.step.step_s(0, chunk, 0, int(pairs))


def decode_rate(profile: Profile, mix: TokenMix, tpot_s: float) -> tuple[int, float]:
    """(rows, output tokens/s) of one decode worker at the largest batch that keeps a step
    inside ``tpot_s``, fits its KV and the row cap (at least one row)."""
    by_kv = max(1, int(profile.kv_capacity_tokens // max(mix.mean_kv_tokens, 1.0)))
    cap = min(profile.max_num_seqs, by_kv)
    best = 1
    for rows in range(1, cap + 1):
        if profile.step.step_s(rows, 0, int(rows * mix.mean_context)) <= tpot_s:
            best = rows
        else:
            break
    return best, best / profile.step.step_s(best, 0, int(best * mix.mean_context))


def size_pools(mix: TokenMix, prefill: Profile, decode: Profile, tpot_s: float,
               utilization: float = 0.7) -> Sizing:
    """Pool sizes for ``mix`` (see the module docstring)."""
    if not 0 < utilization <= 1:
        raise ValueError("utilization must be in (0, 1]")
    cp = prefill_rate(prefill, mix.mean_prompt)
    rows, cd = decode_rate(decode, mix, tpot_s)
    p = max(1, math.ceil(mix.prompt_tokens_s / (cp * utilization)))
    d = max(1, math.ceil(mix.output_tokens_s / (cd * utilization)))
    colo = max(1, math.ceil((mix.prompt_tokens_s / prefill_rate(decode, mix.mean_prompt)
                             + mix.output_tokens_s / cd) / utilization))
    return Sizing(p, d, colo, cp, cd, rows)
