"""A worker's start-up warm-up: a few synthetic steps before the first real request.

A freshly loaded engine's first steps pay one-time costs (thread pools, allocations, page
faults, kernel choices): on this project's 2-core CPU a prefill worker's first 40-token step
took 0.9-1.1 s against ~0.1 s after. Without a warm-up the first user pays them
(docs/bench/first_request.md), and the router's placement starts from no step-cost fit at
all (it places remote until a worker has run a second step of a kind).

    load ─> warm_up(engine) ─> the worker registers with a step-cost fit already in place

The requests it runs (three small phases: a short prompt, longer prompts one at a time, a
batch of short prompts decoded together) and the steps they make are in
tandem/common/warmup_plan.py, which the planner's simulated workers read too; they are cut to the
engine's limits, so a tiny test cache warms up as well. Afterwards the prefix cache
forgets the synthetic blocks and the engine's counters restart at zero
(:meth:`LLMEngine.reset_counters`): a worker's metrics count served traffic only. The
step-cost fit keeps what the warm-up taught it; served steps replace it as they come (its
half-life is 200 steps). SGLang warms a server with a request the same way
(``--skip-server-warmup`` to skip); a worker's ``--skip-warmup`` skips this one.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

from tandem.common.step_costs import StepCosts
from tandem.common.warmup_plan import warmup_phases
from tandem.engine.llm_engine import LLMEngine
from tandem.engine.sampling_params import SamplingParams

_IDS = itertools.count()  # warm-up request ids, unique within the process


@dataclass(frozen=True, slots=True)
class WarmupReport:
    """What the warm-up ran and what the engine's step-cost fit holds after it."""

    requests: int
    steps: int
    seconds: float
    costs: StepCosts

    def describe(self) -> str:
        """One start-up log line: steps, time and the fitted step cost."""
        c = self.costs

        def ms(v: float | None) -> str:
            return "unknown" if v is None else f"{v * 1e3:.2f} ms"

        return (f"warm-up: {self.requests} requests, {self.steps} steps in {self.seconds:.2f} s; "
                f"step cost base {ms(c.base_s)}, per decode row {ms(c.per_row_s)}, "
                f"per prompt token {ms(c.per_prefill_token_s)}")


def warm_up(engine: LLMEngine) -> WarmupReport:
    """Run the warm-up phases (module docstring) on an idle ``engine``, then drop their
    prefix-cache entries and restart its counters. Raises RuntimeError if the engine is not
    idle (a warm-up runs before a worker serves)."""
    if engine.has_unfinished():
        raise RuntimeError("warm_up needs an idle engine")
    started = time.perf_counter()
    steps_before = engine.num_steps
    tokens = _Tokens(engine.arch.vocab_size)
    phases = warmup_phases(engine.max_model_len, _capacity_tokens(engine),
                           engine.config.scheduler.max_num_seqs, engine.scheduler.budget)
    requests = 0
    for phase in phases:
        requests += _run(engine, [tokens.take(n) for n in phase.prompts], phase.output_tokens)
    steps = engine.num_steps - steps_before
    engine.kv.pool.reset_prefix_cache()
    engine.reset_counters()
    return WarmupReport(requests, steps, time.perf_counter() - started,
                        engine.step_costs.costs())


def _run(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> int:
    """Add ``prompts`` (greedy, exactly ``max_tokens`` out) and step until all finish."""
    ids: list[str] = []
    try:
        for p in prompts:
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
            ids.append(engine.add_request(p, params, request_id=f"warmup-{next(_IDS)}"))
        while engine.has_unfinished():
            engine.step()
    finally:
        for rid in ids:  # nothing is left behind, even if a step raised
            engine.abort(rid)
    return len(ids)


def _capacity_tokens(engine: LLMEngine) -> int:
    """Tokens the whole KV cache holds."""
    return engine.kv.pool.num_blocks * engine.config.cache.block_size


class _Tokens:
    """Distinct token ids for every prompt (no prefix-cache hits between them)."""

    def __init__(self, vocab_size: int) -> None:
        self._vocab = vocab_size
        self._next = 1  # id 0 is often a special token; any id is valid input

    def take(self, n: int) -> list[int]:
        """``n`` ids not handed out before (wrapping around a small vocabulary)."""
        out = [(self._next + i) % self._vocab for i in range(n)]
        self._next = (self._next + n) % self._vocab
        return out
