"""The start-up warm-up (tandem/engine/warmup.py): it runs exactly the steps tandem/common/warmup_plan.py
predicts and leaves a step-cost fit with every coefficient known, no block referenced or
cached, the engine's counters at zero, and a later request's output exactly as without it;
it fits engines too small for its default shapes."""

from __future__ import annotations

import pytest

from tandem.common.warmup_plan import warmup_phases, warmup_steps
from tandem.engine import SamplingParams
from tandem.engine.warmup import warm_up


def _greedy(engine, prompt: list[int], tokens: int) -> list[int]:
    rid = engine.add_request(prompt, SamplingParams(max_tokens=tokens, temperature=0.0,
                                                    ignore_eos=True))
    out: list[int] = []
    while engine.has_unfinished():
        for o in engine.step():
            if o.request_id == rid and o.finished:
                out = list(o.token_ids)
    return out


def test_warm_up_fits_every_step_cost_and_leaves_nothing_behind(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=128, block_size=16)
    seen: list[tuple[int, int, int]] = []
    engine.step_costs.observer = lambda rows, tokens, context, seconds: seen.append(
        (rows, tokens, context))
    report = warm_up(engine)
    # the steps tandem/common/warmup_plan.py says it makes (what the simulated workers fit)
    phases = warmup_phases(engine.max_model_len, 128 * 16, engine.config.scheduler.max_num_seqs,
                           engine.scheduler.budget)
    assert seen == [(s.rows, s.prompt_tokens, s.context_tokens) for s in warmup_steps(phases)]
    costs = report.costs
    assert costs.base_s is not None and costs.per_row_s is not None
    assert costs.per_prefill_token_s is not None
    assert costs == engine.step_costs.costs()
    assert report.steps == len(seen) and report.steps - 2 == costs.steps  # two cold steps out
    assert report.requests == 1 + 3 + 8
    assert {rows for rows, _, _ in seen} >= {0, 1, 8}  # decode steps of one row and of eight
    assert len({tokens for _, tokens, _ in seen if tokens}) >= 3  # prompts of several lengths
    stats = engine.stats()
    assert (stats.num_steps, stats.num_generated_tokens, stats.prefix_cache_queries,
            stats.prefix_cache_hits, stats.num_preemptions) == (0, 0, 0, 0, 0)
    assert engine.kv.pool.num_referenced() == 0
    assert engine.kv.pool.num_free == engine.kv.pool.num_blocks
    assert stats.cached_block_hashes == ()
    assert "step cost base" in report.describe()


def test_warm_up_changes_no_later_output(tiny_dir, make_engine) -> None:
    model = str(tiny_dir("llama", 2))
    cold = make_engine(model=model, num_blocks=64, block_size=16)
    warm = make_engine(model=model, num_blocks=64, block_size=16)
    warm_up(warm)
    prompt = list(range(3, 40))
    assert _greedy(warm, prompt, 8) == _greedy(cold, prompt, 8)


def test_warm_up_fits_a_tiny_engine(tiny_dir, make_engine) -> None:
    # 6 blocks of 4 tokens and 2 sequences a step: every phase must shrink to fit.
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=6, block_size=4,
                         max_num_seqs=2, max_model_len=16)
    report = warm_up(engine)
    assert report.costs.base_s is not None
    assert engine.kv.pool.num_referenced() == 0
    assert not engine.has_unfinished()


def test_warm_up_refuses_a_busy_engine(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64, block_size=16)
    rid = engine.add_request([5, 6, 7], SamplingParams(max_tokens=4))
    with pytest.raises(RuntimeError, match="idle"):
        warm_up(engine)
    engine.abort(rid)
