"""Synthetic request traces: when requests arrive, and how long their prompts and replies are.

Every generator returns a sorted ``list[TraceRequest]`` (tandem/planner/trace.py) and is a pure
function of its arguments and ``seed``. Arrival times and lengths come from two random
streams derived from the seed, so the same seed gives the same arrivals whatever the mix::

    poisson    constant rate: exponential gaps
    mmpp       bursty: a two-state Markov-modulated Poisson process (a quiet and a busy
               rate, exponential dwell in each)
    diurnal    rate(t) = mean x (1 - A cos(2 pi t / period)), trough at t = 0, peak at half a
               period, A = (peak/trough - 1) / (peak/trough + 1); drawn by thinning
    multiturn  chat conversations whose every turn extends the previous one (prefix reuse)

Lengths come from a :class:`LengthMix`: request kinds with shares, each with inclusive
uniform prompt and output ranges, and optionally ``prefix_groups`` shared system prompts of
``prefix_tokens`` tokens each, prepended to the prompt drawn (a request picks one group
uniformly). The kinds, mixes and chat shape are tandem/common/request_shapes.py's, the same
ones the load generator (tandem/loadgen) sends.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

# The request shapes are shared with the load generator (one definition: the simulator
# replays the same shapes the benchmark sends); re-exported here for the planner's users.
from tandem.common.request_shapes import (
    CHAT,
    CHAT_SHAPE,
    MIXED,
    MIXES,
    MULTITURN_KIND,
    RAG,
    ChatShape,
    LengthMix,
    RequestKind,
    WorkloadError,
)
from tandem.planner.trace import TraceRequest, sorted_trace

__all__ = ["CHAT", "CHAT_SHAPE", "MIXED", "MIXES", "MULTITURN_KIND", "RAG", "ChatShape",
           "LengthMix", "RequestKind", "TraceSummary", "WorkloadError", "diurnal", "mmpp",
           "multiturn", "poisson", "rescale", "summarize"]


@dataclass(frozen=True, slots=True)
class TraceSummary:
    """What a trace offers: how many requests, how fast, how long, how much is shared."""

    count: int
    duration_s: float  # first to last arrival
    rate: float  # requests/s: (count - 1) / duration_s, 0.0 below two distinct arrivals
    mean_prompt_tokens: float
    mean_output_tokens: float
    # Prompt tokens a declared shared prefix covers, over all prompt tokens: an upper bound on
    # prefix-cache hits (the first request of each group computes its prefix).
    prefix_share: float


def _check_load(rate: float, duration_s: float) -> None:
    if not rate > 0 or not duration_s > 0 or math.isinf(rate * duration_s):
        raise WorkloadError(f"rate ({rate}) and duration_s ({duration_s}) must be > 0, finite")


def _poisson_times(rng: random.Random, rate: float, start: float, end: float) -> list[float]:
    """Arrivals of a Poisson process of ``rate`` in [start, end)."""
    times: list[float] = []
    t = start + rng.expovariate(rate)
    while t < end:
        times.append(t)
        t += rng.expovariate(rate)
    return times


def _with_lengths(times: Sequence[float], lengths: LengthMix, seed: int) -> list[TraceRequest]:
    """A request of ``lengths`` at each of ``times``; the kinds' prefix groups are numbered
    consecutively (first kind's groups first)."""
    rng = random.Random(f"lengths-{seed}")
    kinds = [kind for kind, _ in lengths.kinds]
    weights = [share for _, share in lengths.kinds]
    first_group = [sum(k.prefix_groups for k in kinds[:i]) for i in range(len(kinds))]
    out: list[TraceRequest] = []
    for t in times:
        i = rng.choices(range(len(kinds)), weights)[0]
        kind = kinds[i]
        own = rng.randint(*kind.prompt_tokens)
        output = rng.randint(*kind.output_tokens)
        group = first_group[i] + rng.randrange(kind.prefix_groups) if kind.prefix_groups else -1
        out.append(TraceRequest(arrival_s=t, prompt_tokens=kind.prefix_tokens + own,
                                output_tokens=output, kind=kind.name, prefix_group=group,
                                prefix_tokens=kind.prefix_tokens))
    return out


def poisson(rate: float, duration_s: float, lengths: LengthMix = MIXED,
            seed: int = 0) -> list[TraceRequest]:
    """Requests arriving at a constant ``rate`` per second for ``duration_s`` seconds."""
    _check_load(rate, duration_s)
    return _with_lengths(_poisson_times(random.Random(seed), rate, 0.0, duration_s), lengths,
                         seed)


def mmpp(rates: tuple[float, float], mean_dwell_s: tuple[float, float], duration_s: float,
         lengths: LengthMix = MIXED, seed: int = 0) -> list[TraceRequest]:
    """Bursty arrivals: Poisson at ``rates[s]`` while in state s, which lasts an exponential
    time of mean ``mean_dwell_s[s]`` before switching to the other state.

    The process starts in its stationary state (state s with probability proportional to
    its dwell), so its long-run rate is sum(rate x dwell) / sum(dwell) from t = 0.
    """
    if min(rates) < 0 or max(rates) <= 0 or min(mean_dwell_s) <= 0:
        raise WorkloadError(f"rates {rates} must be >= 0 (one > 0), dwells {mean_dwell_s} > 0")
    _check_load(max(rates), duration_s)
    rng = random.Random(seed)
    state = 0 if rng.random() * sum(mean_dwell_s) < mean_dwell_s[0] else 1
    times: list[float] = []
    t = 0.0
    while t < duration_s:
        end = min(t + rng.expovariate(1.0 / mean_dwell_s[state]), duration_s)
        if rates[state] > 0:  # memoryless: the overshooting gap is dropped at the switch
            times.extend(_poisson_times(rng, rates[state], t, end))
        t, state = end, 1 - state
    return _with_lengths(times, lengths, seed)


def diurnal(mean_rate: float, peak_to_trough: float, period_s: float, duration_s: float,
            lengths: LengthMix = MIXED, seed: int = 0) -> list[TraceRequest]:
    """A daily cycle: the rate swings sinusoidally about ``mean_rate``, its trough at t = 0
    and its peak ``peak_to_trough`` times higher at ``period_s / 2``.

    Drawn by thinning: candidates at the peak rate, each kept with probability
    rate(t) / peak rate.
    """
    if not peak_to_trough >= 1 or math.isinf(peak_to_trough) or not period_s > 0:
        raise WorkloadError("peak_to_trough must be finite and >= 1, period_s > 0")
    _check_load(mean_rate, duration_s)
    amplitude = (peak_to_trough - 1) / (peak_to_trough + 1)
    peak = mean_rate * (1 + amplitude)
    rng = random.Random(seed)

    def rate(t: float) -> float:
        return mean_rate * (1 - amplitude * math.cos(2 * math.pi * t / period_s))

    times = [t for t in _poisson_times(rng, peak, 0.0, duration_s)
             if rng.random() * peak < rate(t)]
    return _with_lengths(times, lengths, seed)


def multiturn(conversation_rate: float, duration_s: float, shape: ChatShape = CHAT_SHAPE,
              seed: int = 0) -> list[TraceRequest]:
    """Chat conversations starting at ``conversation_rate`` per second for ``duration_s``.

    ::

        system prompts  groups 0 .. S-1, each of a length drawn once
        conversation c  group S + c
          turn 0   prompt = system[s] + user_0      prefix: group s, len(system[s])
          turn k   prompt = prompt_{k-1} + reply_{k-1} + user_k
                                                    prefix: group S + c, prompt_{k-1} + reply_{k-1}

    Every turn of a conversation that starts within ``duration_s`` is kept, so the last
    turns may arrive after it. Turn timing is an estimate (see :class:`ChatShape`).
    """
    _check_load(conversation_rate, duration_s)
    rng = random.Random(seed)
    starts = _poisson_times(rng, conversation_rate, 0.0, duration_s)
    lengths = random.Random(f"lengths-{seed}")
    systems = [lengths.randint(*shape.system_tokens) for _ in range(shape.system_prompts)]
    out: list[TraceRequest] = []
    for c, t in enumerate(starts):
        system = lengths.randrange(shape.system_prompts)
        group, prefix = system, systems[system]
        for _ in range(lengths.randint(*shape.turns)):
            prompt = prefix + lengths.randint(*shape.user_tokens)
            output = lengths.randint(*shape.output_tokens)
            out.append(TraceRequest(arrival_s=t, prompt_tokens=prompt, output_tokens=output,
                                    kind=MULTITURN_KIND, prefix_group=group,
                                    prefix_tokens=prefix, conversation=c))
            group, prefix = shape.system_prompts + c, prompt + output
            think = rng.expovariate(1.0 / shape.think_s) if shape.think_s > 0 else 0.0
            t += output * shape.reply_s_per_token + think
    return sorted_trace(out)


def summarize(trace: Sequence[TraceRequest]) -> TraceSummary:
    """Count, rate, mean lengths and prefix share of a trace (sorted by arrival)."""
    if not trace:
        return TraceSummary(0, 0.0, 0.0, 0.0, 0.0, 0.0)
    n = len(trace)
    duration = trace[-1].arrival_s - trace[0].arrival_s
    prompt = sum(r.prompt_tokens for r in trace)
    return TraceSummary(
        count=n,
        duration_s=duration,
        rate=(n - 1) / duration if duration > 0 else 0.0,
        mean_prompt_tokens=prompt / n,
        mean_output_tokens=sum(r.output_tokens for r in trace) / n,
        prefix_share=sum(r.prefix_tokens for r in trace) / prompt,
    )


def rescale(trace: Sequence[TraceRequest], rate: float) -> list[TraceRequest]:
    """The same requests, in the same order, with every arrival time multiplied so that the
    trace's :func:`summarize` rate becomes ``rate`` (think times stretch alike)."""
    current = summarize(trace).rate
    if not rate > 0 or current <= 0:
        raise WorkloadError(f"cannot rescale a trace of rate {current} to {rate}: both > 0")
    factor = current / rate
    return [replace(r, arrival_s=r.arrival_s * factor) for r in trace]
