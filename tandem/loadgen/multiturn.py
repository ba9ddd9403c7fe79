"""Multi-turn chat: conversations that share system prompts and grow turn by turn.

    conversation c, system prompt s (one of K, shared by every conversation that picks it)

      turn 0   prompt = system[s] + user_0                              -> reply_0
      turn 1   prompt = turn 0 prompt + reply_0 + user_1                -> reply_1
      turn 2   prompt = turn 1 prompt + reply_1 + user_2                -> reply_2 ...

Each prompt extends the previous one with the tokens the server actually returned, so a
prefix cache can serve all of it but the new user tokens; and once the K system prompts are
warm, even a conversation's first turn is mostly cached. The replies are only known at run
time: this module plans what the client will say and when; ``next_prompt`` assembles a turn
from the previous one (tandem/loadgen/load.py's ``run_conversations`` drives it).

Conversation starts are a Poisson process at the rate that makes the overall request rate
``rate`` (turns are sent as fast as replies allow); a turn is sent an exponential think time
after the previous reply finished. Within a conversation the load is closed: a slow server
stretches the conversation, so the offered rate falls below ``rate`` under overload.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# One chat shape for the load generator and the planner's simulator.
from tandem.common.request_shapes import CHAT_SHAPE, MULTITURN_KIND, ChatShape, scale_range
from tandem.loadgen.workload import check_load

KIND = MULTITURN_KIND  # RequestResult.kind of every turn


@dataclass(frozen=True, slots=True)
class Turn:
    """One user turn: its request index in the run, what the user adds, how long a reply."""

    index: int
    user_ids: tuple[int, ...]
    max_tokens: int
    think_s: float  # pause after the previous reply before sending (0.0 for turn 0)


@dataclass(frozen=True, slots=True)
class Conversation:
    """One conversation: when it starts (seconds after the run starts) and its turns."""

    index: int
    arrival_s: float
    system: int  # which shared system prompt
    system_ids: tuple[int, ...]
    turns: tuple[Turn, ...]

    def first_prompt(self) -> tuple[int, ...]:
        """Turn 0's prompt: the system prompt and the first user message."""
        return self.system_ids + self.turns[0].user_ids


def next_prompt(
    prompt: tuple[int, ...], reply: tuple[int, ...] | list[int], user_ids: tuple[int, ...]
) -> tuple[int, ...]:
    """The next turn's prompt: the previous prompt, the server's reply, the new user tokens."""
    return prompt + tuple(reply) + user_ids


def make_conversations(
    rate: float,
    num_requests: int,
    *,
    seed: int = 0,
    vocab: tuple[int, int] = (1000, 30000),
    scale: float = 1.0,
    shape: ChatShape = CHAT_SHAPE,
    system_seed: int | None = None,
) -> list[Conversation]:
    """Conversations with ``num_requests`` turns in all, offered at ``rate`` turns/s overall.

    The last conversation is cut short when the turn count does not divide evenly. ``scale``
    multiplies every token length (as ``make_requests``' does); ``vocab`` bounds the ids.
    ``system_seed`` (default: ``seed``) draws the system prompts alone, so runs with
    different ``seed`` can share them, as a deployment's conversations do.
    """
    check_load(rate, num_requests, vocab)
    if shape.system_prompts < 1 or shape.turns[0] < 1:
        raise ValueError("need at least one system prompt and one turn per conversation")

    def ids(rng: random.Random, length: tuple[int, int]) -> tuple[int, ...]:
        n = rng.randint(*scale_range(length, scale))
        return tuple(rng.randrange(vocab[0], vocab[1]) for _ in range(n))

    sys_rng = random.Random(seed if system_seed is None else system_seed)
    systems = [ids(sys_rng, shape.system_tokens) for _ in range(shape.system_prompts)]
    rng = random.Random(f"turns-{seed}")  # a stream of its own: no ids shared with the above
    plans: list[tuple[int, list[Turn]]] = []
    index = 0
    while index < num_requests:
        n_turns = min(rng.randint(*shape.turns), num_requests - index)
        turns = []
        for k in range(n_turns):
            think = rng.expovariate(1.0 / shape.think_s) if k and shape.think_s > 0 else 0.0
            reply = rng.randint(*scale_range(shape.output_tokens, scale))
            turns.append(Turn(index, ids(rng, shape.user_tokens), reply, think))
            index += 1
        plans.append((rng.randrange(len(systems)), turns))
    # ``rate`` requests/s overall = conversation starts/s x turns per conversation.
    start_rate = rate * len(plans) / num_requests
    out: list[Conversation] = []
    t = 0.0
    for c, (system, turns) in enumerate(plans):
        if c:
            t += rng.expovariate(start_rate)
        out.append(Conversation(c, t, system, systems[system], tuple(turns)))
    return out
