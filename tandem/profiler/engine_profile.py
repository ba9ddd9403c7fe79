"""A worker's cost profile, measured on the real engine: what ``tandem profile`` writes.

Times the engine the workers run on steps of known shape (tandem/profiler/engine_steps.py)
and fits tandem/planner/profile.py's step-cost model to them:

    prefill   one prompt of N tokens alone, N up to the chunk budget (PREFILL_TOKENS)
    after     prompt chunks computed after cached tokens (with prefix caching on)
    decode    B rows (DECODE_ROWS) of L-token prompts (DECODE_PROMPTS) generating together
    mixed     a prompt arriving while B rows decode
    transfer  kv_transfer's own TCP transport over loopback, 2,048-token SmolLM2-shaped
              requests (tandem/profiler/transfer_probe.py; a receiver child process)

An engine of ``--tensor-parallel-size`` N is a worker of N devices (``gpus_per_worker``);
its KV bytes per token are one rank's (its share of the heads) and its transfer the one
stream measured above (a group's ranks push in parallel: on N links, up to N times that).

``repeats`` rounds go through every shape and each timed step's median is fitted. The
spread between rounds is reported and stored, the fit's relative error too, with the
samples, so a reader can judge the model before trusting a plan built on it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from tandem.planner.fit import (
    StepSample,
    fit_step_cost,
    fit_token_curve,
    median_of_rounds,
    round_spread,
)
from tandem.planner.profile import Profile, Transfer
from tandem.profiler.engine_steps import (
    measure_decode,
    measure_prefill,
    measure_prefill_after,
    measure_rounds,
    say,
)

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
    say(f"profile: {len(shapes)} shapes x {reps} rounds: prefill of {pre} tokens, prompt "
         f"chunks after cached tokens {after}, decode steps of {rows} rows at prompts "
         f"{list(prompts)} ({steps} steps each), a {arrival}-token prompt joining {joinable} rows")
    measure_prefill(engine, params, pre[:1], 1)  # warm-up: first-call costs stay out
    rounds, labels = measure_rounds(shapes, reps)
    try:
        samples = median_of_rounds(rounds)
        spread = round_spread(rounds)
    except ValueError as err:  # the engine scheduled a shape differently in another round
        say(f"profile: {err}: fitting every round's steps as they are")
        samples, spread = [s for r in rounds for s in r], []
    if reps > 1 and spread:
        worst = max(range(len(spread)), key=spread.__getitem__)
        say(f"profile: slowest round / fastest, per timed step: median "
             f"{statistics.median(spread):.2f}x, max {spread[worst]:.2f}x ({labels[worst]})")
    linear = fit_step_cost(samples)
    c = linear.cost
    say(f"profile: linear fit (what the router sees): {c.base_s * 1e3:.2f} ms + "
         f"{c.per_row_s * 1e3:.3f} ms/row + {c.per_prefill_token_s * 1e6:.1f} us/prompt token "
         f"(rms error {linear.rms_relative_error:.1%}, max {linear.max_relative_error:.1%}, "
         f"{len(samples)} steps)")
    fit = fit_token_curve(samples, c)
    c = fit.cost
    say("profile: step by new tokens: " + ", ".join(
        f"{n:g}: {t * 1e3:.1f} ms" for n, t in c.curve)
        + f"; + {c.curve_per_row_s * 1e3:.2f} ms/decode row, "
        f"{c.per_context_token_s * 1e9:.1f} ns/context token, "
        f"{c.per_prefill_pair_s * 1e9:.2f} ns/prompt pair "
        f"(rms error {fit.rms_relative_error:.1%}, max {fit.max_relative_error:.1%})")
    if options.transfer:
        say("profile: KV transfer over loopback TCP (kv_transfer's transport)")
        from tandem.profiler.transfer_probe import measure_transfer

        transfer = measure_transfer()
        say(f"profile: transfer {transfer.bandwidth_bytes_per_s / 1e9:.2f} GB/s + "
             f"{transfer.latency_s * 1e3:.1f} ms")
    else:
        transfer = Transfer(bandwidth_bytes_per_s=1e9, latency_s=0.0)
    cache = engine.runner.kv_cache
    kv_tokens = cache.shape[2] * cache.shape[3]  # [layers, 2, blocks, block_size, ...]
    per_token = cache.numel() * cache.element_size() // kv_tokens
    threads = engine.config.model.num_threads
    # A tensor-parallel worker: N devices, and this rank's cache holds its share of the KV
    # heads at every block (what roofline.py calls KV bytes per token per GPU).
    ranks = engine.config.tensor_parallel_size
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
        gpus_per_worker=ranks,
        source="measured",
        notes=(f"{engine.weights_format}; threads={threads}; "
               + (f"tensor-parallel-size={ranks}; " if ranks > 1 else "")
               + f"median of {reps} rounds; "
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
