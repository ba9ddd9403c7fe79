"""What structured outputs cost a decode batch: 32 rows with 0, 8 or 32 of them constrained.

    .venv/bin/python -m bench.engine.structured_cost [--model smollm2] [--repeats 3] [--out docs/bench]

The default model as ``make serve`` loads it (SmolLM2, its GGUF's Q4 blocks). Every row
decodes the same number of tokens: unconstrained rows ignore EOS, constrained ones follow a
grammar that cannot end within the token budget, so the batch stays 32 rows for the whole
run. Two grammars: a JSON Schema (nested object, bounded strings, an array: the everyday
case) and a regex with a 60-fold repetition, ``([a-z]+ ){60}``, where most of the vocabulary
needs xgrammar's run-time check at every step (its worst case we know of). Reported: the
median decode step time while all 32 rows run (prefill excluded) and output tokens per
second, each next to the unconstrained batch of the same run (configurations interleaved
across repeats: the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from tandem.engine import EngineConfig, LLMEngine, SamplingParams
from tandem.engine.structured.spec import StructuredOutput

ROWS = 32
TOKENS = 16
_BOUNDED = {"type": "string", "minLength": 8, "maxLength": 12}
SCHEMA = {
    "type": "object",
    "properties": {"name": _BOUNDED, "city": _BOUNDED, "age": {"type": "integer"},
                   "tags": {"type": "array", "minItems": 2, "maxItems": 2,
                            "items": {"type": "string", "minLength": 4, "maxLength": 8}}},
    "required": ["name", "city", "age", "tags"],
    "additionalProperties": False,
}
GRAMMARS = {"json_schema": StructuredOutput("json_schema", json.dumps(SCHEMA)),
            "regex_repeat_60": StructuredOutput("regex", r"([a-z]+ ){60}")}


def one_run(engine: LLMEngine, grammar: StructuredOutput, constrained: int, seed: int) -> float:
    """Median seconds per decode step with all ROWS rows running."""
    prompt = engine.tokenizer.encode("Describe a person in JSON, then list some words:")
    for i in range(ROWS):
        structured = grammar if i < constrained else None
        params = SamplingParams(temperature=1.0, seed=seed * 1000 + i, max_tokens=TOKENS,
                                ignore_eos=structured is None, structured=structured)
        engine.add_request(prompt, params)
    steps: list[float] = []
    while engine.has_unfinished():
        full = engine.stats().num_running == ROWS and engine.stats().num_waiting == 0
        t0 = time.perf_counter()
        outs = engine.step()
        dt = time.perf_counter() - t0
        if full and all(len(o.new_token_ids) == 1 for o in outs) and len(outs) == ROWS:
            steps.append(dt)
    return statistics.median(steps)


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="0: the engine's default")
    ap.add_argument("--out", type=Path, default=None, help="write structured_cost.json here")
    args = ap.parse_args()
    kwargs = {"model": args.model, "max_num_seqs": ROWS}
    if args.threads:
        kwargs["num_threads"] = args.threads
    engine = LLMEngine(EngineConfig.from_kwargs(**kwargs))
    print(f"[bench] warm-up: compiling the grammars, {ROWS} rows x {TOKENS} tokens", flush=True)
    for grammar in GRAMMARS.values():
        one_run(engine, grammar, 8, seed=99)
    configs = [("none", 0)] + [(name, c) for name in GRAMMARS for c in (8, 32)]
    times: dict[tuple[str, int], list[float]] = {c: [] for c in configs}
    for r in range(args.repeats):
        for name, c in configs:
            grammar = GRAMMARS.get(name, GRAMMARS["json_schema"])
            times[(name, c)].append(one_run(engine, grammar, c, seed=r))
            print(f"[bench] repeat {r + 1}/{args.repeats}: {name} x {c:2d} rows: "
                  f"{times[(name, c)][-1] * 1e3:.1f} ms/step", flush=True)
    base = statistics.median(times[("none", 0)])
    rows = []
    print(f"\n{'grammar':>16} | {'rows':>4} | {'ms/step':>8} | {'tok/s':>7} | vs none")
    for name, c in configs:
        step = statistics.median(times[(name, c)])
        rows.append({"grammar": name, "constrained_rows": c, "step_ms": step * 1e3,
                     "tokens_per_s": ROWS / step, "vs_none": base / step})
        print(f"{name:>16} | {c:>4} | {step * 1e3:8.1f} | {ROWS / step:7.1f} | {base / step:.3f}x")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / "structured_cost.json"
        path.write_text(json.dumps({"model": args.model, "rows": ROWS, "tokens": TOKENS,
                                    "grammars": {k: v.value for k, v in GRAMMARS.items()},
                                    "results": rows}, indent=2) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
