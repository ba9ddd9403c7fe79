"""Engine steps of known shape, timed on the real engine (what ``tandem profile`` fits).

The engine is the one the workers run (same flags: model, dtype, quantization, threads, chunk
budget); each function here drives it through steps of one kind and returns a
tandem/planner/fit.py ``StepSample`` per timed step:

    measure_prefill        one prompt of N tokens alone (one step, no decode rows); the
                           prefix cache is reset before each, so every token is computed
    measure_prefill_after  a prompt chunk computed after cached tokens (a long prompt's
                           later chunk: it tells the attention term from the per-token cost)
    measure_decode         B requests of L-token prompts generating together: once all are
                           prefilled, each step has B rows reading sum(lengths) KV positions;
                           with ``arrival``, also the step a new prompt joins them in (checks
                           that prefill and decode costs add, as the model assumes)
    measure_rounds         every shape once per round, alternating the order

Each shape is timed once per round, every round going through all the shapes (odd rounds in
reverse order), and each timed step's median over the rounds is what is fitted: this VM's
speed drifts by up to 2x from hour to hour, and one burst per shape let a slow spell land on
a few shapes only (the 1-thread 32-row step measured 71 ms in one profile and 119 ms in
another).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence

from tandem.planner.fit import StepSample, prefill_context


def say(msg: str) -> None:
    """A progress line on stderr (stdout stays for the command's own output)."""
    print(msg, file=sys.stderr, flush=True)


def _timed_step(engine) -> tuple[float, list]:
    t0 = time.perf_counter()
    outs = engine.step()
    return time.perf_counter() - t0, outs


def _prompt(vocab: int, n: int, salt: int) -> list[int]:
    # Distinct ids per prompt (no accidental prefix hits); deterministic.
    return [100 + (salt * 7919 + i * 104729) % (vocab - 200) for i in range(n)]


def measure_prefill(engine, params, tokens: Sequence[int], repeats: int) -> list[StepSample]:
    """One step per prompt of each length in ``tokens`` (alone, nothing cached)."""
    vocab = engine.arch.vocab_size
    samples = []
    for n in tokens:
        for r in range(repeats):
            engine.kv.pool.reset_prefix_cache()
            engine.add_request(_prompt(vocab, n, 1000 * n + r), params(1))
            seconds, _ = _timed_step(engine)
            while engine.has_unfinished():
                engine.step()
            samples.append(StepSample(0, n, 0, seconds, prefill_context(n)))
    return samples


def measure_prefill_after(engine, params, chunks: Sequence[tuple[int, int]], repeats: int
                          ) -> list[StepSample]:
    """Prompt chunks computed after cached tokens: for each (offset, n), a prompt of
    ``offset`` tokens is run first, then one of ``offset + n`` sharing it, whose step
    computes the n new tokens against the cached ones (what a later chunk of a long prompt
    does; it tells the attention term from the per-token cost)."""
    if not engine.kv.enable_caching:
        return []
    vocab = engine.arch.vocab_size
    block = engine.kv.block_size
    samples = []
    for offset, n in chunks:
        offset -= offset % block
        for r in range(repeats):
            engine.kv.pool.reset_prefix_cache()
            ids = _prompt(vocab, offset + n, 77 * offset + n + r)
            engine.add_request(ids[:offset], params(1))
            while engine.has_unfinished():
                engine.step()
            engine.add_request(ids, params(1))
            seconds, _ = _timed_step(engine)
            while engine.has_unfinished():
                engine.step()
            samples.append(StepSample(0, n, 0, seconds, prefill_context(n, offset)))
    return samples


def measure_decode(engine, params, rows: Sequence[int], prompts: Sequence[int], steps: int,
                   arrival: int = 0) -> list[StepSample]:
    """Decode steps of B rows (each ``prompts`` long); with ``arrival`` > 0, also the step
    in which a prompt of that length joins the B decoding rows.

    A timed step's sample has the rows that ran in it (those with a token out of it) and
    their context. The B prompts take several steps to prefill when they exceed the step's
    token budget, and the first ones decode meanwhile: each request's token allowance
    covers those steps too, so that none finishes inside the timed steps (without that, B =
    32 and 64 rows of 512-token prompts were recorded as such while some of their rows had
    finished: steps running 17-41 rows counted as "32" or "64", which pulled the fitted cost
    per context token from ~5 us to 1)."""
    vocab = engine.arch.vocab_size
    cache = engine.runner.kv_cache
    capacity = cache.shape[2] * cache.shape[3]  # tokens: [layers, 2, blocks, block_size, ..]
    budget = max(engine.config.scheduler.max_num_batched_tokens, 1)
    samples = []
    for length in prompts:
        for b in rows:
            if (b + 1) * (length + steps + 8) > 0.9 * capacity:
                continue  # the batch would not fit (requests would wait, the shape be wrong)
            engine.kv.pool.reset_prefix_cache()
            filling = -(-b * length // budget)  # steps the prompts take: the first decode on
            ids = [engine.add_request(_prompt(vocab, length, 7 * b + i + length), params(
                steps + 4 + filling + (1 if arrival else 0))) for i in range(b)]
            generated = dict.fromkeys(ids, 0)
            while min(generated.values()) < 1:  # prefill them all (possibly several steps)
                for o in engine.step():
                    generated[o.request_id] = len(o.token_ids)
            for _ in range(steps):
                before = dict(generated)
                seconds, outs = _timed_step(engine)
                ran = [o.request_id for o in outs if o.request_id in before]
                samples.append(StepSample(len(ran), 0, sum(length + before[r] for r in ran),
                                          seconds))
                for o in outs:
                    generated[o.request_id] = len(o.token_ids)
            if arrival:
                context = sum(length + g for g in generated.values())
                engine.add_request(_prompt(vocab, arrival, 31 * b + length), params(1))
                seconds, _ = _timed_step(engine)
                samples.append(StepSample(b, arrival, context, seconds,
                                          prefill_context(arrival)))
            while engine.has_unfinished():
                engine.step()
    return samples


def measure_rounds(shapes: Sequence[tuple[str, Callable[[], list[StepSample]]]], rounds: int
                   ) -> tuple[list[list[StepSample]], list[str]]:
    """Every shape's timed steps, once per round: round r goes through ``shapes`` (name,
    timing function) in order, reversed when r is odd so no shape always runs first or
    last. Each round's samples come back in ``shapes`` order, so round lists line up step
    for step; with them, the shape name of each step (the first round's)."""
    out: list[list[StepSample]] = []
    labels: list[str] = []
    for r in range(rounds):
        order = list(range(len(shapes)))[:: -1 if r % 2 else 1]
        got: dict[int, list[StepSample]] = {}
        t0 = time.perf_counter()
        for i in order:
            got[i] = shapes[i][1]()
        say(f"profile: round {r + 1}/{rounds} ({time.perf_counter() - t0:.0f} s)")
        out.append([s for i in range(len(shapes)) for s in got[i]])
        if not labels:
            labels = [shapes[i][0] for i in range(len(shapes)) for _ in got[i]]
    return out, labels
