"""Measure a worker's cost profile on the real engine (what ``tandem profile`` writes).

Runs the engine the workers run (same flags: model, dtype, quantization, threads, chunk
budget) on steps of known shape and fits tandem/planner/profile.py's step-cost model to them:

    prefill   one prompt of N tokens alone (one step, no decode rows), N up to the chunk
              budget; the prefix cache is reset before each, so every token is computed
    decode    B requests of L-token prompts generating together: once all are prefilled,
              each step has B rows reading sum(lengths) KV positions
    mixed     a prompt arriving while B rows decode: the step that prefills it carries both
              (checks that prefill and decode costs add, as the model assumes)
    transfer  kv_transfer's own TCP transport over loopback (bench/kv_transfer.py's sender
              and receiver child), 2,048-token SmolLM2-shaped requests

Each shape is timed once per round, ``repeats`` rounds, every round going through all the
shapes (odd rounds in reverse order), and each timed step's median over the rounds is what
is fitted: this VM's speed drifts by up to 2x from hour to hour, and one burst per shape let
a slow spell land on a few shapes only (the 1-thread 32-row step measured 71 ms in one
profile and 119 ms in another). The spread between rounds is reported and stored, the fit's
relative error too, with the samples, so a reader can judge the model before trusting a plan
built on it.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tandem.planner.fit import (
    StepSample,
    fit_step_cost,
    fit_token_curve,
    median_of_rounds,
    prefill_context,
    round_spread,
)
from tandem.planner.profile import Profile, Transfer

PREFILL_TOKENS = (16, 64, 128, 256, 512, 1024, 2048)
DECODE_ROWS = (1, 2, 4, 8, 16, 32, 64)
DECODE_PROMPTS = (32, 512)
DECODE_STEPS = 8  # timed decode steps per (rows, prompt) shape


@dataclass(frozen=True, slots=True)
class ProfileOptions:
    """What to measure, and how thoroughly."""

    repeats: int = 3  # rounds over every shape (the median of each timed step is fitted)
    quick: bool = False  # fewer shapes, fewer decode steps (tests, smoke runs)
    transfer: bool = True  # measure the KV transport (spawns a receiver child)


def _say(msg: str) -> None:
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
    covers those steps too, so that none finishes inside the timed steps (until stop 41 the
    allowance did not, and B = 32 and 64 rows of 512-token prompts were recorded as such
    while their rows finished: 11-13 steps of each of run 25's profiles ran 17-41 rows as
    "32" or "64", which pulled the fitted cost per context token from ~5 us to 1)."""
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


def measure_transfer() -> Transfer:
    """kv_transfer's TCP transport over loopback: bandwidth from 8 back-to-back 2,048-token
    requests, the fixed cost from one alone (connection, handshake, first frame)."""
    from bench.kv_transfer import BLOCKS_PER_REQ, LAYOUT, make_cache, run_ours

    src = make_cache(fill=True)
    req_bytes = LAYOUT.payload_bytes(LAYOUT.num_layers, BLOCKS_PER_REQ)
    many = asyncio.run(run_ours("tcp", 8, src))
    one = asyncio.run(run_ours("tcp", 1, src))
    bandwidth = many.gbps * 1e9
    latency = max(req_bytes / (one.gbps * 1e9) - req_bytes / bandwidth, 0.0)
    return Transfer(bandwidth_bytes_per_s=bandwidth, latency_s=latency)


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
        _say(f"profile: round {r + 1}/{rounds} ({time.perf_counter() - t0:.0f} s)")
        out.append([s for i in range(len(shapes)) for s in got[i]])
        if not labels:
            labels = [shapes[i][0] for i in range(len(shapes)) for _ in got[i]]
    return out, labels


def profile_engine(engine, options: ProfileOptions = ProfileOptions(),
                   label: str = "", device: str = "cpu") -> Profile:
    """Time ``engine`` (an engine.LLMEngine) on the shapes above and fit its profile."""
    from tandem.engine import SamplingParams

    def params(n: int) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)

    sched = engine.config.scheduler
    budget = sched.max_num_batched_tokens
    quick = options.quick
    pre = [n for n in PREFILL_TOKENS if n <= budget][: 3 if quick else None]
    rows = [b for b in DECODE_ROWS if b <= sched.max_num_seqs][: 3 if quick else None]
    prompts = DECODE_PROMPTS[:1] if quick else DECODE_PROMPTS
    steps = 3 if quick else DECODE_STEPS
    reps = options.repeats
    after = [(o, n) for o, n in ((512, 128), (1536, 128), (512, 512), (1536, 512))
             if o + n <= budget and o + n <= engine.max_model_len][: 2 if quick else None]
    joinable = [b for b in rows if b < sched.max_num_seqs][-2:]  # room for the arrival's row
    arrival = min(256, budget)
    shapes: list[tuple[str, Callable[[], list[StepSample]]]] = []
    for n in pre:
        shapes.append((f"prefill {n}", lambda n=n: measure_prefill(engine, params, [n], 1)))
    for o, n in after:
        shapes.append((f"prefill {n} after {o}",
                       lambda o=o, n=n: measure_prefill_after(engine, params, [(o, n)], 1)))
    for length in prompts:
        for b in rows:
            shapes.append((f"decode {b}x{length}", lambda b=b, length=length: measure_decode(
                engine, params, [b], [length], steps)))
    for b in joinable:
        shapes.append((f"mixed {b}+{arrival}", lambda b=b: measure_decode(
            engine, params, [b], prompts[:1], 1, arrival=arrival)))
    _say(f"profile: {len(shapes)} shapes x {reps} rounds: prefill of {pre} tokens, prompt "
         f"chunks after cached tokens {after}, decode steps of {rows} rows at prompts "
         f"{list(prompts)} ({steps} steps each), a {arrival}-token prompt joining {joinable} rows")
    measure_prefill(engine, params, pre[:1], 1)  # warm-up: first-call costs stay out
    rounds, labels = measure_rounds(shapes, reps)
    try:
        samples = median_of_rounds(rounds)
        spread = round_spread(rounds)
    except ValueError as err:  # the engine scheduled a shape differently in another round
        _say(f"profile: {err}: fitting every round's steps as they are")
        samples, spread = [s for r in rounds for s in r], []
    if reps > 1 and spread:
        worst = max(range(len(spread)), key=spread.__getitem__)
        _say(f"profile: slowest round / fastest, per timed step: median "
             f"{statistics.median(spread):.2f}x, max {spread[worst]:.2f}x ({labels[worst]})")
    linear = fit_step_cost(samples)
    c = linear.cost
    _say(f"profile: linear fit (what the router sees): {c.base_s * 1e3:.2f} ms + "
         f"{c.per_row_s * 1e3:.3f} ms/row + {c.per_prefill_token_s * 1e6:.1f} us/prompt token "
         f"(rms error {linear.rms_relative_error:.1%}, max {linear.max_relative_error:.1%}, "
         f"{len(samples)} steps)")
    fit = fit_token_curve(samples, c)
    c = fit.cost
    _say("profile: step by new tokens: " + ", ".join(
        f"{n:g}: {t * 1e3:.1f} ms" for n, t in c.curve)
        + f"; + {c.curve_per_row_s * 1e3:.2f} ms/decode row, "
        f"{c.per_context_token_s * 1e9:.1f} ns/context token, "
        f"{c.per_prefill_pair_s * 1e9:.2f} ns/prompt pair "
        f"(rms error {fit.rms_relative_error:.1%}, max {fit.max_relative_error:.1%})")
    if options.transfer:
        _say("profile: KV transfer over loopback TCP (kv_transfer's transport)")
        transfer = measure_transfer()
        _say(f"profile: transfer {transfer.bandwidth_bytes_per_s / 1e9:.2f} GB/s + "
             f"{transfer.latency_s * 1e3:.1f} ms")
    else:
        transfer = Transfer(bandwidth_bytes_per_s=1e9, latency_s=0.0)
    cache = engine.runner.kv_cache
    kv_tokens = cache.shape[2] * cache.shape[3]  # [layers, 2, blocks, block_size, ...]
    per_token = cache.numel() * cache.element_size() // kv_tokens
    threads = engine.config.model.num_threads
    return Profile(
        model=label or engine.model_path.name,
        device=device,
        step=c,
        transfer=transfer,
        kv_bytes_per_token=int(per_token),
        kv_capacity_tokens=int(kv_tokens),
        chunk_tokens=budget,
        max_num_seqs=sched.max_num_seqs,
        block_size=engine.kv.block_size,
        source="measured",
        notes=(f"{engine.weights_format}; threads={threads}; median of {reps} rounds; "
               f"fit rms {fit.rms_relative_error:.3f} max {fit.max_relative_error:.3f}; "
               f"transfer {'measured' if options.transfer else 'not measured (1 GB/s)'}"),
        samples={
            "fit_rms_relative_error": fit.rms_relative_error,
            "fit_max_relative_error": fit.max_relative_error,
            "linear_fit_rms_relative_error": linear.rms_relative_error,
            "rounds": reps,
            "round_spread": [round(x, 4) for x in spread],
            "steps": [[s.rows, s.prefill_tokens, s.context_tokens, s.prefill_pairs,
                       round(s.seconds, 6)] for s in samples],
            "median_prefill_tok_s": {
                str(n): n / statistics.median(s.seconds for s in samples
                                              if s.rows == 0 and s.prefill_tokens == n)
                for n in pre},
        },
    )
