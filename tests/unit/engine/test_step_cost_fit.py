"""The engine's step-cost fit (tandem/common/step_costs.py, what the router's placement reads): the
first step with prompt tokens and the first without are cold and stay out of it; the step
observer (a worker's --step-log) still sees every step."""

from __future__ import annotations

from tandem.engine import SamplingParams


def _finish(engine, prompt: list[int], tokens: int) -> None:
    engine.add_request(prompt, SamplingParams(max_tokens=tokens, temperature=0.0,
                                              ignore_eos=True))
    while engine.has_unfinished():
        engine.step()


def test_the_first_step_of_each_kind_stays_out_of_the_fit(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64, block_size=16)
    seen: list[tuple[int, int]] = []
    engine.step_costs.observer = lambda rows, tokens, context, seconds: seen.append((rows, tokens))
    assert engine.step_costs.costs().base_s is None
    _finish(engine, list(range(5, 25)), 1)  # one prefill step, nothing else
    assert seen == [(0, 20)]
    assert engine.step_costs.costs().base_s is None  # the cold prefill step: not fitted
    _finish(engine, list(range(30, 50)), 3)  # a warm prefill step, then decode steps
    assert seen[1:] == [(0, 20), (1, 0), (1, 0)]
    costs = engine.step_costs.costs()
    # fitted: the second prefill step and the second decode step (the first decode one: cold)
    assert costs.base_s is not None and costs.per_prefill_token_s is not None
    assert costs.steps == 2
