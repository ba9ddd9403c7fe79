"""The start-up warm-up's plan (tandem/common/warmup_plan.py): its phases stay inside an engine's
limits, and its steps mark the first prefill and the first decode step cold."""

from __future__ import annotations

import pytest

from tandem.common.warmup_plan import WarmupPhase, warmup_phases, warmup_steps


@pytest.mark.parametrize(("max_model_len", "capacity", "seqs", "budget"), [
    (8192, 100_000, 256, 2048),  # a default engine: nothing is cut
    (16, 24, 2, 2048),  # a tiny test cache
    (4096, 4096, 64, 32),  # a small token budget per step
    (8, 16, 1, 1),  # one token a step, one sequence
])
def test_every_phase_fits_the_engine(max_model_len: int, capacity: int, seqs: int,
                                     budget: int) -> None:
    phases = warmup_phases(max_model_len, capacity, seqs, budget)
    assert len(phases) >= 3
    for phase in phases:
        assert 1 <= len(phase.prompts) <= seqs
        assert sum(phase.prompts) <= max(budget, 1)  # one step holds all its prompts
        assert all(1 <= n and n + phase.output_tokens <= max_model_len for n in phase.prompts)
        assert sum(n + phase.output_tokens for n in phase.prompts) <= capacity


def test_a_default_engine_runs_the_documented_phases() -> None:
    phases = warmup_phases(8192, 100_000, 256, 2048)
    assert phases == [WarmupPhase((16,), 4), WarmupPhase((32,), 2), WarmupPhase((128,), 2),
                      WarmupPhase((256,), 2), WarmupPhase((8,) * 8, 6)]


def test_steps_follow_the_phases_and_mark_two_cold() -> None:
    steps = warmup_steps([WarmupPhase((16,), 3), WarmupPhase((4, 4), 2)])
    shapes = [(s.rows, s.prompt_tokens, s.context_tokens, s.prefill_pairs, s.cold)
              for s in steps]
    assert shapes == [
        (0, 16, 16, 136, True),  # the first prefill step: cold
        (1, 0, 17, 0, True),  # the first decode step: cold
        (1, 0, 18, 0, False),
        (0, 8, 8, 20, False),  # two 4-token prompts in one step: 2 * (4 * 5 / 2) pairs
        (2, 0, 10, 0, False),
    ]
