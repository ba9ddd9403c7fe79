"""The request shapes of the serving workloads: how long prompts and replies are, and in what mix.

One definition for the two sides that must agree on them: the load generator
(tandem/loadgen) sends requests of these shapes to a live router, and the planner's
simulator (tandem/planner/workload.py) replays the same shapes as traces, so a plan and a
measured run describe the same workload. It lives here rather than in the planner so the lean
client distribution can ship the load generator without any planner code.

    RequestKind  one shape: inclusive uniform prompt and output ranges, optional shared prefixes
    LengthMix    request kinds with shares summing to 1
    RAG, CHAT    the serving benchmark's two kinds (long prompt / short answer, and the reverse)
    MIXES        the benchmark's mixes by name: mixed (30% RAG), chat, rag
    ChatShape    a multi-turn chat workload's lengths and pacing (CHAT_SHAPE: the default)

Sized for SmolLM2 on 2 CPU cores; ``scaled`` multiplies every length (``--scale``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CHAT", "CHAT_SHAPE", "MIXED", "MIXES", "MULTITURN_KIND", "RAG", "ChatShape",
           "LengthMix", "RequestKind", "WorkloadError", "scale_range", "scaled"]


class WorkloadError(ValueError):
    """Arguments that describe no workload (a rate <= 0, an empty range, ...)."""


def _check_range(label: str, r: tuple[int, int]) -> None:
    if not 1 <= r[0] <= r[1]:
        raise WorkloadError(f"{label} range {r} must satisfy 1 <= low <= high")


@dataclass(frozen=True, slots=True)
class RequestKind:
    """One request shape: token ranges (inclusive, uniform) and optional shared prefixes."""

    name: str
    prompt_tokens: tuple[int, int]  # the request's own part, after any shared prefix
    output_tokens: tuple[int, int]
    prefix_groups: int = 0  # distinct shared system prompts (0: nothing shared)
    prefix_tokens: int = 0  # tokens in each shared system prompt

    def __post_init__(self) -> None:
        _check_range(f"{self.name} prompt", self.prompt_tokens)
        _check_range(f"{self.name} output", self.output_tokens)
        if self.prefix_groups < 0 or self.prefix_tokens < 0 or (
                (self.prefix_groups > 0) != (self.prefix_tokens > 0)):
            raise WorkloadError(f"{self.name}: prefix_groups and prefix_tokens are both > 0 "
                                "or both 0")


@dataclass(frozen=True, slots=True)
class LengthMix:
    """Request kinds and the share of each (shares > 0, summing to 1)."""

    name: str
    kinds: tuple[tuple[RequestKind, float], ...]

    def __post_init__(self) -> None:
        total = sum(share for _, share in self.kinds)
        if not self.kinds or abs(total - 1.0) > 1e-6 or min(s for _, s in self.kinds) <= 0:
            raise WorkloadError(f"mix {self.name!r}: shares must be > 0 and sum to 1, not {total}")


# The serving benchmark's kinds and mixes, sized for SmolLM2 on 2 CPU cores; --scale
# multiplies their lengths.
RAG = RequestKind("rag", prompt_tokens=(768, 1024), output_tokens=(16, 32))
CHAT = RequestKind("chat", prompt_tokens=(32, 96), output_tokens=(64, 128))
MIXES: dict[str, LengthMix] = {
    "mixed": LengthMix("mixed", ((RAG, 0.3), (CHAT, 0.7))),
    "chat": LengthMix("chat", ((CHAT, 1.0),)),
    "rag": LengthMix("rag", ((RAG, 1.0),)),
}
MIXED = MIXES["mixed"]


@dataclass(frozen=True, slots=True)
class ChatShape:
    """A multi-turn workload's lengths (inclusive uniform ranges) and pacing.

    The load generator's multi-turn clients (tandem/loadgen/multiturn.py) use the fields up
    to ``think_s``.
    ``reply_s_per_token`` is a trace's guess at how long a reply takes to stream: a trace
    cannot know when the server finishes a reply, so turn k+1 arrives at turn k's arrival +
    its output tokens x ``reply_s_per_token`` + an exponential think time of mean
    ``think_s``. A simulator may re-time the turns of a ``conversation`` from the replies'
    actual ends (the load generator's clients do: their load is closed).
    """

    system_prompts: int = 4  # distinct shared system prompts
    system_tokens: tuple[int, int] = (192, 256)
    turns: tuple[int, int] = (3, 4)  # turns per conversation
    user_tokens: tuple[int, int] = (16, 48)  # new tokens per user turn
    output_tokens: tuple[int, int] = (32, 64)  # reply length
    think_s: float = 1.0  # mean pause between a reply and the next user turn
    reply_s_per_token: float = 0.02  # estimated streaming time per reply token (a TPOT)

    def __post_init__(self) -> None:
        for label in ("system_tokens", "turns", "user_tokens", "output_tokens"):
            _check_range(label, getattr(self, label))
        if self.system_prompts < 1 or self.think_s < 0 or self.reply_s_per_token < 0:
            raise WorkloadError("need >= 1 system prompt, think_s and reply_s_per_token >= 0")


CHAT_SHAPE = ChatShape()
MULTITURN_KIND = "multiturn"  # the kind of every turn of a multi-turn chat workload


def scale_range(r: tuple[int, int], scale: float) -> tuple[int, int]:
    """An inclusive length range multiplied by ``scale`` (at least one token)."""
    return max(1, round(r[0] * scale)), max(1, round(r[1] * scale))


def scaled(kind: RequestKind, scale: float) -> RequestKind:
    """``kind`` with every length multiplied by ``scale`` (at least one token)."""
    return RequestKind(
        kind.name, scale_range(kind.prompt_tokens, scale), scale_range(kind.output_tokens, scale)
    )
