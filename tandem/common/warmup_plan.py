"""What a worker's start-up warm-up runs, and the steps that makes, without torch.

The engine runs these requests before a worker serves (tandem/engine/warmup.py: first-call costs
paid, a step-cost fit in place); the planner's simulated workers fit the same steps at their
profile's costs (tandem/planner/sim/signals.py), so a simulated worker starts from the fit a real one
starts from. Three phases, each run to its end:

    phase   prompts (tokens)         tokens out   steps it makes
    1       one of 16                4            a prefill step, 3 one-row decode steps
    2       32, 128, 256 in turn     2 each       a prefill step and a one-row decode step each
    3       8 of 8, together         6            one 64-token prefill step, 5 eight-row steps

The first step with prompt tokens and the first without are cold: the engine keeps them out
of its fit (tandem/engine/llm_engine.py ``_observe_step``), and :func:`warmup_steps` marks them.
:func:`warmup_phases` cuts the phases to an engine's limits (context length, KV capacity,
sequences and tokens per step), so each phase's prompts fit one step and a tiny test engine
warms up too.
"""

from __future__ import annotations

from dataclasses import dataclass

FIRST_PROMPT = 16  # phase 1's prompt
FIRST_OUTPUT = 4  # phase 1's tokens out: the cold decode step, then two that count
PROMPT_LENGTHS = (32, 128, 256)  # phase 2, before the limits cut them
PROMPT_OUTPUT = 2
BATCH_ROWS = 8  # phase 3's prompts, decoded together
BATCH_PROMPT = 8
BATCH_OUTPUT = 6


@dataclass(frozen=True, slots=True)
class WarmupPhase:
    """Prompts added together (their lengths in tokens), each generating ``output_tokens``."""

    prompts: tuple[int, ...]
    output_tokens: int


@dataclass(frozen=True, slots=True)
class WarmupStep:
    """One engine step of the warm-up: decode ``rows``, ``prompt_tokens`` prompt tokens,
    ``context_tokens`` the tokens in its requests' KV once it ran (what the engine's step
    observer reports), ``prefill_pairs`` the prompts' causal (query, key) pairs, ``cold``
    when the fit leaves it out."""

    rows: int
    prompt_tokens: int
    context_tokens: int
    prefill_pairs: int
    cold: bool


def warmup_phases(max_model_len: int, capacity_tokens: int, max_num_seqs: int,
                  max_num_batched_tokens: int) -> list[WarmupPhase]:
    """The warm-up's phases for an engine with these limits (module docstring)."""
    room = max(FIRST_OUTPUT, PROMPT_OUTPUT, BATCH_OUTPUT)
    # The longest prompt: in the context with room to generate, in half the KV cache, in
    # one step's token budget.
    limit = max(1, min(max_model_len - room, capacity_tokens // 2 - room, max_num_batched_tokens))
    rows = max(1, min(BATCH_ROWS, max_num_seqs,
                      capacity_tokens // (2 * (BATCH_PROMPT + BATCH_OUTPUT)),
                      max_num_batched_tokens // min(BATCH_PROMPT, limit)))
    phases = [WarmupPhase((min(FIRST_PROMPT, limit),), FIRST_OUTPUT)]
    phases += [WarmupPhase((n,), PROMPT_OUTPUT)
               for n in sorted({min(n, limit) for n in PROMPT_LENGTHS})]
    phases.append(WarmupPhase((min(BATCH_PROMPT, limit),) * rows, BATCH_OUTPUT))
    return phases


def warmup_steps(phases: list[WarmupPhase]) -> list[WarmupStep]:
    """The steps the phases make, in order: per phase one prefill step of all its prompts,
    then ``output_tokens - 1`` decode steps of one row per prompt (the prefill step samples
    the first token)."""
    steps: list[WarmupStep] = []
    seen_prefill = seen_decode = False
    for phase in phases:
        steps.append(WarmupStep(0, sum(phase.prompts), sum(phase.prompts),
                                sum(n * (n + 1) // 2 for n in phase.prompts), not seen_prefill))
        seen_prefill = True
        for j in range(1, phase.output_tokens):
            context = sum(n + j for n in phase.prompts)
            steps.append(WarmupStep(len(phase.prompts), 0, context, 0, not seen_decode))
            seen_decode = True
    return steps
