"""Replay greedy outputs through n-gram proposal rules: which rule, k and n-gram sizes pay.

    python -m bench.engine.ngram_replay [--max-tokens 128] [--out docs/bench]

Greedy output does not depend on speculation, so one plain run per prompt tells, for any
proposal rule, exactly which drafts the target accepts at every step: the longest prefix of the
proposal that equals the next plain tokens. With the measured time of a fused forward step of
r rows (SmolLM2 fp32, 256 cached tokens), every rule's speedup over plain decoding follows from
the same outputs, side by side, without running each rule:

    speedup = plain tokens x step(1) / sum over speculative steps of step(1 + proposed)

Rules: ``earliest``: k tokens after the earliest match (transformers' prompt lookup, Tandem's
rule before); ``latest``: k tokens after the latest match; ``latest-halving``: the engine's rule
(tandem/engine/spec/ngram.py), k after a match of ``n_max`` tokens, half as many per token shorter.
Two prompt sets: the lookup benchmark's (bench/engine_lookup.TASKS) and HELD_OUT below, other
documents and edits. The engine's rule was picked because it led on both; the benchmark's
defaults (k=6, n-grams of 1..4) were picked on the held-out set alone. A 135M model copies
loosely, so no rule comes near k+1 tokens a step. Prefill, Python and the proposer are not in
the model, and the one-row time is noisy: the replay ranks rules, bench.engine.vs_transformers's lookup
workload measures them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.engine.lookup import TASKS, lookup_prompts
from tandem.engine.spec.ngram import ngram_matches, proposal_length

_EMAIL = (
    "Hi Maria,\n\nThanks for sending the quarterly report. I read it this morning and the "
    "numbers for the west region look strong. Could you add a short section about the new "
    "warehouse and the delivery times in March? Please send the updated file by Friday.\n\n"
    "Best regards,\nTom"
)
_STACK = '''class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from empty stack")
        return self.items.pop()

    def size(self):
        return len(self.items)
'''
_PACKAGE = '''{
  "name": "tandem",
  "version": "1.2.0",
  "dependencies": {
    "grpcio": "1.60.0",
    "msgpack": "1.0.7",
    "torch": "2.3.0"
  },
  "license": "Apache-2.0"
}'''
_LIST = (
    "Shopping list: two liters of milk, a loaf of rye bread, six eggs, a bag of apples, "
    "fresh basil, olive oil, and a block of cheddar cheese."
)
_STORY = (
    "Once upon a time a small fox lived at the edge of a quiet forest. Every morning the fox "
    "walked to the river to drink, and every evening it climbed the hill to watch the sun go "
    "down. One day a heron landed by the river and asked the fox why it always came alone."
)
HELD_OUT = [
    "Rewrite this email so it is addressed to Anna instead of Maria. Keep everything else.\n\n"
    + _EMAIL,
    "Rename the method `size` to `__len__` in this class and show the whole class.\n\n" + _STACK,
    "Change the version to 1.3.0 in this JSON and print the whole JSON.\n\n" + _PACKAGE,
    "Turn this into a bulleted list, one item per line:\n\n" + _LIST,
    "Repeat the following story word for word:\n\n" + _STORY,
    "Add type hints to this class. Show the full code.\n\n" + _STACK,
]

Rule = Callable[[list[int], int], list[int]]


def make_rule(kind: str, k: int, n_max: int, n_min: int) -> Rule:
    """A proposer ``(context, slots) -> drafts`` following rule ``kind`` (see the module doc)."""

    def rule(ctx: list[int], slots: int) -> list[int]:
        n, follows = ngram_matches(ctx, n_max, n_min)
        if not n or slots <= 0:
            return []
        i = int(follows[0] if kind == "earliest" else follows[-1])
        m = proposal_length(k, n, n_max) if kind == "latest-halving" else k
        return ctx[i : i + min(m, slots)]

    return rule


def replay(prompts: list[list[int]], outputs: list[list[int]], rule: Rule,
           step_ms: Callable[[int], float]) -> dict[str, float]:
    """Predicted speedup, tokens per step and acceptance of ``rule`` on these greedy outputs."""
    plain = spec = 0.0
    steps = proposed = accepted = 0
    for prompt, out in zip(prompts, outputs, strict=True):
        t = 0
        while t < len(out):
            drafts = rule(prompt + out[:t], len(out) - t - 1)
            a = 0
            while a < len(drafts) and drafts[a] == out[t + a]:
                a += 1
            spec += step_ms(1 + len(drafts))
            steps, proposed, accepted = steps + 1, proposed + len(drafts), accepted + a
            t += a + 1
        plain += step_ms(1) * len(out)
    tokens = sum(len(o) for o in outputs)
    return {"speedup": plain / spec, "tokens_per_step": tokens / steps,
            "acceptance": accepted / proposed if proposed else 0.0}


def step_costs(llm: Any, max_rows: int, rounds: int = 9) -> dict[int, float]:
    """Median ms of one fused forward step of 1 .. ``max_rows`` rows, 256 cached tokens; each
    round times every row count once, so a slow spell of the machine hits them all alike."""
    runner = llm.engine.runner
    if runner.fused is None:
        raise SystemExit("the fused native forward is unavailable here (g++ and AVX2 needed)")
    ctx = 256
    table = list(range(1, 2 + (ctx + max_rows) // runner.block_size))

    def step(rows: int) -> float:
        ids, pos = list(range(1000, 1000 + rows)), list(range(ctx, ctx + rows))
        t0 = time.perf_counter()
        runner.fused(ids, pos, [0] * rows, [table], runner.kv_cache, list(range(rows)))
        return time.perf_counter() - t0

    step(max_rows)  # warm-up
    times: dict[int, list[float]] = {rows: [] for rows in range(1, max_rows + 1)}
    for _ in range(rounds):
        for rows in times:
            times[rows].append(step(rows))
    costs = {rows: statistics.median(t) * 1e3 for rows, t in times.items()}
    for rows, ms in costs.items():
        print(f"  step of {rows:2d} rows: {ms:6.1f} ms", flush=True)
    return costs


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--ks", default="4,6,8")
    ap.add_argument("--out", default=None, help="directory for ngram-replay.json")
    args = ap.parse_args()
    import torch

    from tandem.engine import LLM, SamplingParams

    torch.set_num_threads(2)
    llm = LLM("smollm2", progress=False, dtype="float32", num_blocks=64)
    tok = llm.engine.tokenizer
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, speculative=False)
    sets = {}
    for name, tasks in (("benchmark", TASKS), ("held_out", HELD_OUT)):
        prompts = lookup_prompts(tok, tasks)
        print(f"plain greedy outputs of the {name} prompts ({len(prompts)})", flush=True)
        outputs = [llm.generate([p], params)[0].token_ids for p in prompts]
        sets[name] = (prompts, outputs)
    ks = [int(k) for k in args.ks.split(",")]
    costs = step_costs(llm, max(ks) + 1)
    rows = []
    for kind in ("earliest", "latest", "latest-halving"):
        for n_max, n_min in ((3, 2), (3, 1), (4, 1)):
            for k in ks:
                row: dict[str, Any] = {"rule": kind, "k": k, "n_max": n_max, "n_min": n_min}
                for name, (prompts, outputs) in sets.items():
                    res = replay(prompts, outputs, make_rule(kind, k, n_max, n_min),
                                 costs.__getitem__)
                    row.update({f"{name}_{key}": val for key, val in res.items()})
                rows.append(row)
    print(f"\n{'rule':>15} {'k':>2} {'n':>4} | {'benchmark x':>11} {'tok/step':>8} | "
          f"{'held-out x':>10} {'tok/step':>8}")
    for r in rows:
        print(f"{r['rule']:>15} {r['k']:>2} {r['n_min']}..{r['n_max']} | "
              f"{r['benchmark_speedup']:>11.3f} {r['benchmark_tokens_per_step']:>8.2f} | "
              f"{r['held_out_speedup']:>10.3f} {r['held_out_tokens_per_step']:>8.2f}")
    best = max(rows, key=lambda r: r["held_out_speedup"])
    print(f"\nbest on held-out: {best['rule']} k={best['k']} n={best['n_min']}..{best['n_max']} "
          f"(benchmark {best['benchmark_speedup']:.3f}x)")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "ngram-replay.json").write_text(json.dumps(
            {"step_ms": costs, "rows": rows,
             "output_tokens": {n: int(np.sum([len(o) for o in s[1]])) for n, s in sets.items()}},
            indent=1))


if __name__ == "__main__":
    main()
